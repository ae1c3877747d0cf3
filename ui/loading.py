"""A report read in a background thread, so the page stays responsive while a large recording is checked: how far
it got (for a progress bar), then its Recording or the message saying why it does not open.

Plain Python (no Streamlit): ui/recorded.py keeps one in st.session_state and polls it from a fragment. The thread
writes only this object's fields; a read replaced by another one finishes into its own object, which nobody reads.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from profiling.report_reader import SHORTER, Progress, Recording, ReportReadError


@dataclass(slots=True, eq=False)
class Loading:
    """One background read: its progress, then its outcome (a Recording, or the message of why it failed)."""

    name: str  # the file, as the user gave it
    started: float = field(default_factory=time.monotonic)
    fraction: float = 0.0
    what: str = "starting"
    outcome: Recording | str | None = None
    thread: threading.Thread | None = None

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def report(self, fraction: float, what: str) -> None:
        self.fraction, self.what = fraction, what

    def wait(self, timeout: float) -> Recording | str | None:
        """The outcome once the read is over (waiting up to timeout seconds for it), else None."""
        self.thread.join(timeout)
        return None if self.thread.is_alive() else self.outcome


def start(read: Callable[[Progress], Recording], name: str) -> Loading:
    """read(progress) in a new daemon thread."""
    loading = Loading(name)

    def work() -> None:
        try:
            loading.outcome = read(loading.report)
        except ReportReadError as exc:
            loading.outcome = str(exc)
        except MemoryError:
            loading.outcome = f"{name} does not fit in this server's memory: {SHORTER}."
        except Exception as exc:  # noqa: BLE001 - an exception in a thread reaches no page: it is the message
            loading.outcome = (f"{name} could not be opened ({type(exc).__name__}: {exc}); that is a bug of the "
                               "report reader (profiling/report_reader.py): please report it with the file.")

    loading.thread = threading.Thread(target=work, name=f"read {name}", daemon=True)
    loading.thread.start()
    return loading
