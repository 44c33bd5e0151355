#!/usr/bin/env bash
# The CPU path against an earlier commit (issue 29's no-regression check): attention_scaling at 16k and 64k
# tokens (grids 128² and 256², laplacian, fwd+bwd, one thread), the two trees interleaved for ROUNDS rounds so
# that machine noise hits both alike; prints and writes per-round medians and head/base ratios.
#   BASE=/path/to/worktree/of/the/earlier/commit benchmarks/ab_attention_scaling.sh [OUT_STEM]
# (make BASE with `git worktree add --detach /tmp/base <commit>`); OUT_STEM default
# benchmarks/results/attention_scaling_ab (.json, .md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BASE=${BASE:?set BASE to a worktree of the earlier commit}
ROUNDS=${ROUNDS:-3}
OUT=${1:-benchmarks/results/attention_scaling_ab}
TMP=$(mktemp -d)
for r in $(seq "$ROUNDS"); do
    for tree in base head; do
        src=$PWD/src; [ "$tree" = base ] && src=$BASE/src
        PYTHONPATH=$src "$PY" -m laplacianformer.bench.attention_scaling --sizes 128 256 --methods laplacian \
            --repeats 5 --threads 1 --no-memory --out "$TMP/${tree}_$r" > /dev/null
    done
done
"$PY" - "$TMP" "$ROUNDS" "$OUT" "$(git -C "$BASE" rev-parse --short HEAD)" "$(git rev-parse --short HEAD)" <<'PYEOF'
import json, statistics, sys
tmp, rounds, out, base, head = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = []
for n in (16384, 65536):
    ms = {t: [next(x["time"]["median_ms"] for x in json.load(open(f"{tmp}/{t}_{r}.json"))["results"]["records"]
                   if x["n"] == n) for r in range(1, rounds + 1)] for t in ("base", "head")}
    ratios = [h / b for b, h in zip(ms["base"], ms["head"])]
    rows.append(dict(tokens=n, base_ms=ms["base"], head_ms=ms["head"], ratios=ratios, median_ratio=statistics.median(ratios)))
json.dump(dict(base=base, head=head, rounds=rounds, rows=rows), open(out + ".json", "w"), indent=1)
md = [f"laplacian_attention fwd+bwd on the CPU (one thread, B1 H2 d32, m 49): {head} (head) against {base} (base), "
      f"{rounds} interleaved rounds, each the median of 5 calls\n", "| tokens | base ms per round | head ms per round | head/base per round | median ratio |",
      "|---|---|---|---|---|"]
md += [f"| {r['tokens']} | {', '.join(f'{x:.1f}' for x in r['base_ms'])} | {', '.join(f'{x:.1f}' for x in r['head_ms'])} "
       f"| {', '.join(f'{x:.3f}' for x in r['ratios'])} | {r['median_ratio']:.3f} |" for r in rows]
open(out + ".md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PYEOF
