"""Rewrite the H200 section of benchmarks/RESULTS.md from one run's outputs (the .md tables and .json files
that bench_kernels and bench_decode write), with the issue-7 targets computed from the JSON.

    python -m benchmarks.results_md DIR      # DIR holds kernels-cuda.{md,json} and decode-cuda.{md,json}
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"
SECTION = re.compile(r"^## H200\n.*?(?=^## CPU)", re.S | re.M)


def _targets(kernels: dict, decode: dict) -> str:
    attn = kernels["verify_attn"]
    big = [r for r in attn if r["N"] * kernels["attention"]["heads"] >= 512 and r["S"] >= 4096]
    worst = min(attn, key=lambda r: r["speedup"])
    build = {r["B"]: r for r in kernels["tree_build"]}
    ar = next(r for r in decode["rows"] if r["mode"] == "AR")
    dd64 = next(r for r in decode["rows"] if r["mode"] != "AR" and r["budget"] == 64 and not r["noise"])

    def span(key: str, fmt: str) -> str:
        values = [r[key] for r in big]
        return f"{fmt.format(min(values))} to {fmt.format(max(values))}"

    def met(ok: bool) -> str:
        return "met" if ok else "not met"

    def met_except(cases: list[dict], ok) -> str:
        missed = [f"N={r['N']}, S={r['S']}" for r in cases if not ok(r)]
        if not missed:
            return "met"
        return f"met in {len(cases) - len(missed)} of {len(cases)} cases; not met at {'; '.join(missed)}"

    rows = [
        ("verify_attn >= 50% of the measured bf16 roofline at N·H >= 512 and S >= 4096",
         f"{span('ours_roofline', '{:.0%}')} ({met_except(big, lambda r: r['ours_roofline'] >= 0.5)})"),
        ("verify_attn >= 2x the torch baseline there",
         f"{span('speedup', '{:.2f}x')} ({met_except(big, lambda r: r['speedup'] >= 2)})"),
        ("verify_attn no slower than the torch baseline anywhere",
         f"slowest case N={worst['N']}, S={worst['S']}: {worst['speedup']:.2f}x ({met(worst['speedup'] >= 1)})"),
        ("tree_build at B=256, V=163840 under 50 µs",
         f"{build[256]['ours_us']:.1f} µs ({met(build[256]['ours_us'] < 50)})"),
        ("DDTree verify step at B=64 under 1.5x the AR step",
         f"eager {dd64['step_over_ar_eager']:.2f}x, graph {dd64['step_over_ar_graph']:.2f}x "
         f"({met(max(dd64['step_over_ar_eager'], dd64['step_over_ar_graph']) < 1.5)}); "
         f"AR step {ar['eager_step_ms']:.3f} ms eager, {ar['graph_step_ms']:.3f} ms graph"),
    ]
    table = "\n".join(f"| {target} | {where} |" for target, where in rows)
    return f"### Targets of issue 7\n\n| target | where we land |\n|---|---|\n{table}\n"


def _revision(env: dict) -> str:
    if not env["git_commit"]:
        return "on a copy of the working tree"
    if env.get("git_dirty"):
        return f"on the working tree at commit {env['git_commit'][:12]} with uncommitted changes"
    return f"at commit {env['git_commit'][:12]}"


def render(run_dir: Path) -> str:
    kernels = json.loads((run_dir / "kernels-cuda.json").read_text())
    decode = json.loads((run_dir / "decode-cuda.json").read_text())
    env = kernels["environment"]
    runs = f"run {kernels['date'][:10]} {_revision(env)}"
    if decode["date"][:10] != kernels["date"][:10] or decode["environment"]["git_commit"] != env["git_commit"]:
        runs = (f"bench_kernels run {kernels['date'][:10]} {_revision(env)}, bench_decode run {decode['date'][:10]} "
                f"{_revision(decode['environment'])}")
    body = [
        "## H200\n",
        f"{env['device_name']}, torch {env['torch']}, CUDA {env['cuda']}, {runs}; "
        "the commands are `bash benchmarks/h200_session.sh bench` "
        "(which runs the two below) and `python -m benchmarks.results_md $OUT` to write this section.\n",
        _targets(kernels, decode),
        "### bench_kernels\n",
        (run_dir / "kernels-cuda.md").read_text().replace("\n## ", "\n#### ").strip() + "\n",
        "### bench_decode\n",
        (run_dir / "decode-cuda.md").read_text().replace("\n## ", "\n#### ").strip() + "\n\n",
    ]
    return "\n".join(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    text = RESULTS.read_text()
    if not SECTION.search(text):
        raise SystemExit(f"{RESULTS} has no '## H200' section followed by '## CPU'")
    RESULTS.write_text(SECTION.sub(lambda _: render(args.run_dir), text, count=1))
    print(f"rewrote the H200 section of {RESULTS} from {args.run_dir}")


if __name__ == "__main__":
    main()
