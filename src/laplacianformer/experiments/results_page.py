"""docs/RESULTS.md's ablation section, generated from the results files (docs/DESIGN.md §7).

The page keeps its prose by hand; the block between ``BEGIN`` and ``END`` below is rewritten from
``results/ablations/NAME.json`` so that no number in it is copied by hand: an overview (status, cells, seeds,
verdicts per ablation), every claim's verdict, then each ablation's table and plot.

    python -m laplacianformer.experiments.results_page [--results results/ablations] [--page docs/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .ablations import ABLATIONS
from .common import markdown_table, read_json
from .evidence import ablation_of, markdown, seed_coverage, status

BEGIN = "<!-- BEGIN generated ablations: python -m laplacianformer.experiments.results_page; do not edit by hand -->"
END = "<!-- END generated ablations -->"


def _records(results: Path) -> dict[str, dict | None]:
    """ablation name -> its fixed-protocol record, or None where no such file exists yet (legacy files skipped)."""
    out: dict[str, dict | None] = {}
    for name in ABLATIONS:
        path = results / f"{name}.json"
        record = read_json(path) if path.is_file() else None
        out[name] = record if record is not None and "protocol" in record else None
    return out


def _seeds(record: dict) -> str:
    seeds = sorted({int(c["seed"]) for c in record.get("cells", {}).values()})
    coverage = seed_coverage(record)
    return (", ".join(map(str, seeds)) or "none") + (f" ({coverage})" if coverage else "")


def overview(records: dict[str, dict | None]) -> str:
    """One row per ablation: status, recorded cells, seeds, verdicts so far."""
    rows = []
    for name, record in records.items():
        if record is None:
            rows.append([f"`{name}`", "not run under this protocol yet", 0, "—", "—"])
            continue
        verdicts = "; ".join(f"{v['verdict']}" for v in record.get("verdicts", [])) or "—"
        total = len(record.get("cells", {})) + len(record.get("missing", []))
        rows.append([f"[`{name}`](#ablation-{name})", status(record), f"{len(record.get('cells', {}))} of {total}",
                     _seeds(record), verdicts])
    return markdown_table(["ablation", "status", "cells", "seeds", "verdicts"], rows)


def claims(records: dict[str, dict | None]) -> str:
    """Every claim of every recorded ablation with its verdict and the file's status beside it."""
    rows = []
    for name, record in records.items():
        for v in (record or {}).get("verdicts", []):
            rows.append([v["claim"], f"`{name}`", f"**{v['verdict']}**", status(record)])
    if not rows:
        return "No claim has a verdict yet."
    return markdown_table(["claim", "ablation", "verdict", "file status"], rows)


def section(results: Path, page_dir: Path) -> str:
    """The generated block (without its markers)."""
    records = _records(results)
    parts = ["### Overview", "", overview(records), "", "### Verdicts so far", "",
             "A verdict of an INCOMPLETE file may still change as its missing cells are added.", "",
             claims(records), ""]
    for name, record in records.items():
        if record is None:
            continue
        body = markdown(record, ablation_of(record)).replace(f"### ablation `{name}`", f"### Ablation `{name}`", 1)
        parts += [f'<a id="ablation-{name}"></a>', "", body]
        png = results / f"{name}.png"
        if png.is_file():
            parts += [f"![{name}]({Path(os.path.relpath(png, page_dir)).as_posix()})", ""]
    return "\n".join(parts).rstrip() + "\n"


def rewrite(page: Path, results: Path) -> bool:
    """Replace the block between the markers of ``page``; True if the file changed."""
    text = page.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"page: {page} must hold the markers {BEGIN!r} and {END!r} once each, in that order")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{section(results, page.parent)}{END}{tail}"
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=Path("results/ablations"), help="folder of NAME.json files")
    p.add_argument("--page", type=Path, default=Path("docs/RESULTS.md"), help="page holding the markers")
    args = p.parse_args(argv)
    if not args.page.is_file():
        p.error(f"--page: {args.page} does not exist")
    changed = rewrite(args.page, args.results)
    print(f"{args.page}: {'rewritten' if changed else 'unchanged'} from {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
