"""A model release pipeline on edgekit's Python API: compress, measure on the device, compare with the
last release's report, and ship only when the gate passes.

    python examples/release_pipeline.py examples/digits/artifacts/model.pt2 \\
        --eval-data examples/digits/artifacts/eval.npz --calib-data examples/digits/artifacts/calib.npz \\
        --recipe examples/digits/recipe.yaml --previous releases/v1/report.json --out releases/v2

What it does:
  1. ``edgekit.deploy(...)`` builds the recipe's variants, measures each on the target device and writes
     report.json / report.md / report.html / junit.xml into --out. With --previous, the gate also
     compares every shipped variant with its namesake in that report: a p50 latency regression that is
     both significant (bootstrap CI of the ratio of medians + Mann-Whitney U) and above the threshold,
     an accuracy drop against the last release, a peak memory or size increase each fail the gate.
  2. ``report.diff(previous)`` gives the per-variant, per-metric changes (for release notes).
  3. In GitHub Actions, report.md is appended to the job summary ($GITHUB_STEP_SUMMARY); junit.xml is
     what the CI's test view reads (see examples/ci/edgekit-release.yml).

Exit codes: 0 ship, 1 the gate failed (each failed check printed), 2 bad input, 3 device failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import edgekit
from edgekit import Report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help=".pt2, .onnx, or .pt/.pth with --arch")
    ap.add_argument("--eval-data", required=True)
    ap.add_argument("--calib-data")
    ap.add_argument("--recipe")
    ap.add_argument("--target", default="local")
    ap.add_argument("--device", help="device name from the inventory (not needed for --target local)")
    ap.add_argument("--previous", type=Path, help="the last release's report.json (skipped when absent: first release)")
    ap.add_argument("--out", type=Path, default=Path("release-out"))
    ap.add_argument("--max-latency-regression", type=float, default=0.10, help="fraction (significant and above fails)")
    ap.add_argument("--max-release-accuracy-drop", type=float, default=0.5, help="points vs the last release")
    args = ap.parse_args(argv)

    previous = args.previous if args.previous and args.previous.is_file() else None
    if args.previous and previous is None:
        print(f"no previous report at {args.previous}: first release, no baseline comparison", file=sys.stderr)
    try:
        report = edgekit.deploy(
            args.model,
            target=args.target,
            device=args.device,
            eval_data=args.eval_data,
            calib_data=args.calib_data,
            recipe=args.recipe,
            out=args.out,
            baseline_report=previous,
            max_latency_regression=args.max_latency_regression,
            max_release_accuracy_drop=args.max_release_accuracy_drop,
            progress=lambda msg: print(f"edgekit: {msg}", file=sys.stderr),
        )
    except edgekit.EdgekitError as exc:  # bad input (2) or device failure (3): no report was written
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code

    # Release notes: what changed since the last release, with the significance of each latency change.
    if previous is not None:
        diff = report.diff(Report.load(previous))
        for vd in diff.variants:
            lat = vd.get("latency_p50_ms")
            acc = vd.get("accuracy")
            print(f"{vd.variant}: latency {lat.message if lat else 'n/a'}; accuracy {acc.message if acc else 'n/a'}")
        for name in diff.added:
            print(f"{name}: new variant")

    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write((args.out / "report.md").read_text(encoding="utf-8"))

    try:
        report.raise_for_gate()
    except edgekit.GateFailed as exc:
        print("gate FAILED:")
        for name, message in exc.failed:
            print(f"  {name}: {message}")
        return exc.exit_code
    shipped = report.shipped  # the variant the run says to ship (None for a recipe of one variant: the model)
    print(f"gate PASSED: ship {shipped.name if shipped else report.baseline} (report: {args.out / 'report.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
