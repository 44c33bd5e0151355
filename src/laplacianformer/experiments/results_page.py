"""docs/RESULTS.md's generated sections, from the results files (docs/DESIGN.md §7).

The page keeps its prose by hand; two blocks between markers are rewritten so that no number in them is
copied by hand:
- ablations (``BEGIN`` … ``END``), from ``results/ablations/NAME.json``: an overview (status, cells, seeds,
  verdicts per ablation), every claim's verdict, then each ablation's table and plot;
- accuracy (``ACCURACY_BEGIN`` … ``ACCURACY_END``), from ``results/accuracy/`` (selection on validation
  data, confirmation on test; DESIGN §7.5) and ``results/analysis/gain_tokens.md`` (DESIGN §4.6).
- kernel families (``KERNELS_BEGIN`` … ``KERNELS_END``), from ``results/kernels/`` (the bandwidth selection on
  validation data, the confirmation on test, the why analysis; DESIGN §7.8) and the families' detection rows
  from ``results/detection/fashionscenes.json`` (``detection_report.kernel_family_table``).
The README's accuracy claims (``CLAIMS_BEGIN`` … ``CLAIMS_END``) are rewritten from the same confirmation
when ``--readme`` holds those markers.

    python -m laplacianformer.experiments.results_page [--results results/ablations] [--accuracy results/accuracy]
                                                       [--page docs/RESULTS.md] [--readme README.md] [--publish]

Without ``--publish`` the page is copied to ``runs/results_page/`` and rewritten there (the published page is
left alone); ``--publish`` rewrites ``--page`` itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ..ops.settings import WHITENED_OUTPUT_SCALE
from .ablations import ABLATIONS
from .accuracy import claims_markdown
from .common import markdown_table, read_json
from .detection_report import kernel_family_table
from .evidence import ablation_of, markdown, seed_coverage, status

BEGIN = "<!-- BEGIN generated ablations: python -m laplacianformer.experiments.results_page; do not edit by hand -->"
END = "<!-- END generated ablations -->"
ACCURACY_BEGIN = "<!-- BEGIN generated accuracy: python -m laplacianformer.experiments.results_page; do not edit by hand -->"
ACCURACY_END = "<!-- END generated accuracy -->"
KERNELS_BEGIN = "<!-- BEGIN generated kernel families: python -m laplacianformer.experiments.results_page; do not edit by hand -->"
KERNELS_END = "<!-- END generated kernel families -->"
CLAIMS_BEGIN = "<!-- BEGIN generated accuracy claims: python -m laplacianformer.experiments.results_page; do not edit by hand -->"
CLAIMS_END = "<!-- END generated accuracy claims -->"


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


def accuracy_section(accuracy: Path, gain_md: Path, page_dir: Path) -> str:
    """The generated accuracy block: the gain table, the selection and the confirmation as recorded."""
    parts = []
    for title, path in (("Output gain against tokens at initialisation (DESIGN §4.6)", gain_md),
                        ("Selection on validation data (DESIGN §7.5)", accuracy / "selection.md"),
                        ("Confirmation on the test set (DESIGN §7.5)", accuracy / "confirmation.md")):
        body = path.read_text(encoding="utf-8").strip() if path.is_file() else "Not recorded yet."
        body = "\n".join(line for line in body.splitlines() if not line.startswith("### analysis"))
        parts += [f"### {title}", "", body.strip(), ""]
        png = path.with_suffix(".png")
        if png.is_file():
            parts += [f"![{path.stem}]({Path(os.path.relpath(png, page_dir)).as_posix()})", ""]
    return "\n".join(parts).rstrip() + "\n"


def kernels_section(kernels: Path, page_dir: Path, detection: Path | None = None) -> str:
    """The generated kernel-family block: the bandwidth selection, the confirmation and the why analysis as
    recorded (``laplacianformer kernels report`` / ``why`` write them), and the families' detection rows from
    ``detection`` (the ``detection_report`` JSON) when given."""
    parts = []
    for title, path in (("Bandwidth selection per family on validation data (DESIGN §7.8)", kernels / "selection.md"),
                        ("Each family at its selected λ on the test set (DESIGN §7.8)", kernels / "confirmation.md")):
        body = path.read_text(encoding="utf-8").strip() if path.is_file() else "Not recorded yet."
        parts += [f"### {title}", "", body, ""]
        png = path.with_suffix(".png")
        if png.is_file():
            parts += [f"![{path.stem}]({Path(os.path.relpath(png, page_dir)).as_posix()})", ""]
    if detection is not None:
        report = read_json(detection) if detection.is_file() else None
        table = kernel_family_table(report) if report is not None else ""
        rel = Path(os.path.relpath(detection.with_suffix(".md"), page_dir)).as_posix()
        parts += ["### Detection: FashionScenes RetinaNet, full-val bbox AP (DESIGN §7.8)", "",
                  (f"From [{detection.with_suffix('.md').as_posix()}]({rel}) (`python -m "
                   "laplacianformer.experiments.detection_report`); AP in points, mean ± std over seeds, Δ paired by "
                   "seed (a − b, Student's t).\n\n" + table.rstrip()) if table else "Not recorded yet.", ""]
    why = kernels / "why" / "why.md"
    parts += ["### Why: distances, kernel values, Nyström error (DESIGN §7.8)", "",
              f"[{why.as_posix()}]({Path(os.path.relpath(why, page_dir)).as_posix()})" if why.is_file()
              else "Not recorded yet.", ""]
    return "\n".join(parts).rstrip() + "\n"


def readme_claims(accuracy: Path) -> str:
    """The README's accuracy claims: the confirmation's protocol in one line and its claims table."""
    conf = read_json(accuracy / "confirmation.json")
    if conf is None:
        return "Not recorded yet.\n"
    seeds = {c["n"] for c in conf["configurations"].values()}
    split = conf.get("validation_split") or {}
    head = (f"Accuracy of micro models trained on {split.get('trained_on', 'the')} Fashion-MNIST training images "
            f"(protocol {conf['protocol']['name']}), scored on the test set: Δ top-1 in points "
            f"({'/'.join(map(str, sorted(seeds)))} paired seeds{'' if conf['complete'] else ', incomplete'}; "
            f"chosen on validation: `{conf['chosen']}` = `attn_preset=\"tuned\"`; "
            f"`results/accuracy/confirmation.json`). `default` is the paper's unscaled map (`norm_scale=\"one\"`, "
            f"the library default up to 0.1)"
            + (f"; `{conf['best_scale']}` is the best output scale alone"
               + (", the library default since 0.2 (DESIGN §7.6)"
                  if conf["best_scale"] == f"scale_{WHITENED_OUTPUT_SCALE}" else "")
               if conf.get("best_scale") else "") + ":")
    return f"{head}\n\n{claims_markdown(conf)}\n"


def replace_block(page: Path, begin: str, end: str, body: str) -> bool:
    """Replace the text between the markers ``begin`` and ``end`` of ``page`` by ``body``; True if it changed."""
    text = page.read_text(encoding="utf-8")
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"page: {page} must hold the markers {begin!r} and {end!r} once each, in that order")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{body}{end}{tail}"
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


def rewrite(page: Path, results: Path, accuracy: Path | None = None, gain_md: Path | None = None,
            kernels: Path | None = None, detection: Path | None = None) -> bool:
    """Rewrite the ablation block of ``page`` (and the accuracy block when ``accuracy`` is given, the kernel-family
    block when ``kernels`` is given and the page holds its markers, with the detection rows of ``detection``, the
    ``detection_report`` JSON); True if the file changed."""
    changed = replace_block(page, BEGIN, END, section(results, page.parent))
    if accuracy is not None:
        gain_md = gain_md or Path("results/analysis/gain_tokens.md")
        changed |= replace_block(page, ACCURACY_BEGIN, ACCURACY_END, accuracy_section(accuracy, gain_md, page.parent))
    if kernels is not None and KERNELS_BEGIN in page.read_text(encoding="utf-8"):
        changed |= replace_block(page, KERNELS_BEGIN, KERNELS_END, kernels_section(kernels, page.parent, detection))
    return changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=Path("results/ablations"), help="folder of NAME.json files")
    p.add_argument("--accuracy", type=Path, default=Path("results/accuracy"),
                   help="folder of selection/confirmation files (DESIGN §7.5)")
    p.add_argument("--kernels", type=Path, default=Path("results/kernels"),
                   help="folder of the kernel-family study's files (DESIGN §7.8)")
    p.add_argument("--detection", type=Path, default=Path("results/detection/fashionscenes.json"),
                   help="detection_report's JSON: the kernel families' detection rows (DESIGN §7.8)")
    p.add_argument("--gain", type=Path, default=Path("results/analysis/gain_tokens.md"), help="gain-tokens table")
    p.add_argument("--page", type=Path, default=Path("docs/RESULTS.md"), help="page holding the markers")
    p.add_argument("--readme", type=Path, default=Path("README.md"),
                   help="file whose accuracy-claims markers get the confirmation's claims (skipped without them)")
    p.add_argument("--publish", action="store_true", help="rewrite --page itself (default: a copy under runs/results_page/)")
    args = p.parse_args(argv)
    if not args.page.is_file():
        p.error(f"--page: {args.page} does not exist")
    page = args.page
    if not args.publish:
        page = Path("runs/results_page") / args.page.name
        page.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.page, page)
    changed = rewrite(page, args.results, args.accuracy, args.gain, args.kernels, args.detection)
    print(f"{page}: {'rewritten' if changed else 'unchanged'} from {args.results}, {args.accuracy}"
          + ("" if args.publish else " (pass --publish to rewrite the published page)"))
    if args.readme is not None and args.readme.is_file() and CLAIMS_BEGIN in args.readme.read_text(encoding="utf-8"):
        readme = args.readme
        if not args.publish:
            readme = page.parent / args.readme.name
            shutil.copyfile(args.readme, readme)
        changed = replace_block(readme, CLAIMS_BEGIN, CLAIMS_END, readme_claims(args.accuracy))
        print(f"{readme}: {'rewritten' if changed else 'unchanged'} (accuracy claims)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
