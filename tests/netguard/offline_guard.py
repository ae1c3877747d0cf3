"""The tests' network guard: a connection or a name lookup that would leave this machine is refused and logged.

The studio works fully offline, so no test may reach beyond the loopback interface, and neither may any process a
test starts (the dashboard's server included): tests/conftest.py installs this guard in the test process and puts
this folder on PYTHONPATH, so its sitecustomize.py installs it in every Python subprocess too. Each refusal is
appended to the file DDTREE_NETGUARD_LOG names; conftest fails the test during which the file grew. Logging matters
because some callers swallow the error (Streamlit's address lookups return None on any exception).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import traceback

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
LOG_ENV = "DDTREE_NETGUARD_LOG"


def is_local(host: object, for_bind: bool = False) -> bool:
    """A loopback address or name (or, for a bind, the wildcard address); a remote name is not local."""
    if host is None:
        return True
    text = host.decode() if isinstance(host, bytes) else str(host)
    if text.lower() in LOCAL_NAMES or (for_bind and text == ""):
        return True
    try:
        address = ipaddress.ip_address(text.split("%")[0].strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or (for_bind and address.is_unspecified)


def _refuse(what: str) -> None:
    log = os.environ.get(LOG_ENV)
    if log:
        stack = "".join(traceback.format_stack(limit=12)[:-2])
        with open(log, "a") as f:
            f.write(f"pid {os.getpid()}: {what}\n{stack}\n")
    raise OSError(101, f"the tests allow no network beyond this machine: {what}")  # ENETUNREACH


def install() -> None:
    """Wrap socket.connect / connect_ex / sendto and getaddrinfo (once per process)."""
    if getattr(socket, "_ddtree_guarded", False):
        return
    real_connect, real_connect_ex, real_sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto
    real_getaddrinfo = socket.getaddrinfo

    def check_address(sock: socket.socket, address: object) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and \
                not is_local(address[0]):
            _refuse(f"connect to {address!r}")

    def connect(self, address):
        check_address(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check_address(self, address)
        return real_connect_ex(self, address)

    def sendto(self, data, *args):
        check_address(self, args[-1])
        return real_sendto(self, data, *args)

    def getaddrinfo(host, *args, **kwargs):
        if not is_local(host, for_bind=True):
            _refuse(f"look up {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto = connect, connect_ex, sendto
    socket.getaddrinfo = getaddrinfo
    socket._ddtree_guarded = True
