"""Ahead-of-time compile of every Triton kernel specialisation the launchers can produce, for real GPU
targets, on a machine without a GPU (docs/KERNELS.md, "Compiling for GPUs without one").

    python -m benchmarks.triton_aot [--arch 80,90] [--strict] [--subset fast] [--json PATH] [--md PATH]
                                    [--match WORDS] [--kernel NAMES]

The specialisations come from the Triton modules themselves (``MODULES``): each defines
``aot_specialisations(d_max=128, m_max=128)`` yielding tuples

    (kernel, signature, constexprs, num_warps, num_stages, label[, options])

built by the same configuration functions its launchers call at run time. ``kernel`` is the
``@triton.jit`` function, ``signature`` maps every non-constexpr argument name to a Triton type string
(``"*fp32"``, ``"*bf16"``, ``"i32"``, ``"fp32"``), ``constexprs`` maps the constexpr argument names to
their values, ``label`` is ``"<family> key=value ..."`` (keys such as ``dtype``, ``kid`` (the kernel family's
id, the constexpr ``KID``), ``d``, ``e``,
``m``, ``v``, ``inj``, ``lw``, ``conv``; the fast subset filters on them), ``options`` (optional) further keyword
options of ``triton.compile`` the launcher passes too (e.g. ``{"maxnreg": 255}``). Pointer arguments are compiled with 16-byte divisibility,
as the runtime specialises them for torch allocations.

Each specialisation is compiled with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))``
(the bundled ptxas, no driver). Registers and spill bytes come from ptxas' verbose log (rerun on the PTX
when the compile was a cache hit), shared memory from the compiled metadata. Exit status: 1 when a
compile fails; with ``--strict`` also when any specialisation spills or asks for more shared memory than
the target's per-block limit (``SHARED_LIMIT``), whose registers × threads exceed the register file a block may
use (``REGISTER_FILE``: 255 registers at 16 warps compiles, and fails at launch), or when a distance kernel's inner
loop is too slow (below).

**SASS instruction mix.** Each cubin is disassembled with the ``nvdisasm`` bundled with Triton
(``sass_mix``): instructions are counted per opcode class (``CLASSES``: fp32 arithmetic, SHFL, global /
shared loads and stores, MUFU, BAR, integer and address arithmetic, tensor-core MMA, uniform datapath,
control). The inner loop is the innermost back-edge (a ``BRA`` to an earlier address; its body is the
instructions from the target through the branch), the most deeply nested one when there are several, the
longest on a tie; with no back-edge the whole kernel is the body. In a distance kernel it is the innermost
loop with the largest share of fp32 arithmetic (the distance loop, where a conv's taps or a product's chunks
nest as deep).

A *distance kernel* is one whose module lists it in ``DISTANCE_LOOPS`` (kernel name -> function of the
specialisation's constexprs giving T, the (row, landmark, feature) triples one iteration of its loop over
d computes, summed over the whole program; None for a specialisation without such a loop). Its cost per
triple is

    per_triple = (instructions in the inner-loop body) × 32 · num_warps / T

(every thread issues the body once per iteration; predicated-off instructions count). If ptxas unrolled
the d loop further, the body holds k iterations and the figure reads k times too high (a false failure,
never a false pass). ``--strict`` fails a distance kernel whose inner loop contains a SHFL or costs more
than ``MAX_PER_TRIPLE`` instructions per triple, or the budget its module states for the label
(``distance_budget(constexprs, label fields)``, argued in docs/KERNELS.md: "Register budget", "The streaming passes").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path


MODULES = [
    "laplacianformer.ops.kernel.triton",
    "laplacianformer.ops.newton_schulz.triton",
    "laplacianformer.ops.normalization.triton",
    "laplacianformer.ops.streaming.triton",
    "laplacianformer.ops.streaming.landmarks_triton",
    "laplacianformer.ops.streaming.backward_stats_triton",
    "laplacianformer.ops.streaming.backward_landmarks_triton",
    "laplacianformer.ops.streaming.backward_rows_triton",
]
"""Modules with an ``aot_specialisations`` function; a new Triton module adds its name here."""

MAX_PER_TRIPLE = 2.5
"""Most SASS instructions per (row, landmark, feature) triple a distance kernel's inner loop may cost (two
are the floor for L1: the difference and the accumulate with |.|)."""

SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
REGISTER_FILE = 64 * 1024
"""32-bit registers one block may use on sm_80 and sm_90: at 255 registers a thread, at most 8 warps."""
"""Largest dynamic shared memory one block may use (opt-in maximum): A100 (sm_80), H100/H200 (sm_90)."""

FAST = {"dtype": {"fp32"}, "kid": {"0"}, "d": {"64", "128"}, "m": {"64", "128"}, "inj": {"1"},
        "lw": {"16"}, "conv": {"1"}}
"""The fast subset (the default test run): labels whose keys, where present, take these values, and e equal
to d (to m where a label has no d): the model's path (float32 compute, the Laplacian, head dim 64, m = 49 padded to 64,
the injective normalisation, the 7 landmark columns of its 7 × 7 grid padded to 16, the streaming output
pass with the layer's DWConv(V)) and the largest shapes."""


@dataclass
class Row:
    target: str
    family: str
    label: str
    config: str
    warps: int
    stages: int
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack: int | None = None
    shared: int | None = None
    shared_limit: int | None = None
    seconds: float | None = None
    cached: bool = False
    error: str | None = None
    mix: dict[str, int] | None = None
    loop_mix: dict[str, int] | None = None
    loop_instructions: int | None = None
    per_triple: float | None = None
    triple_budget: float = MAX_PER_TRIPLE

    @property
    def spill(self) -> int:
        return max(self.spill_stores or 0, self.spill_loads or 0)

    def fits(self) -> bool:
        return (self.error is None and self.spill == 0 and (self.shared or 0) <= (self.shared_limit or 0)
                and self.registers_fit() and self.distance_ok())

    def registers_fit(self) -> bool:
        """Whether a block's threads get their registers: registers × 32 · warps within ``REGISTER_FILE`` (else
        the launch fails on the GPU with OutOfResources, whatever ptxas reported)."""
        return (self.registers or 0) * 32 * self.warps <= REGISTER_FILE

    def distance_ok(self) -> bool:
        """True unless this is a distance kernel whose distance loop shuffles or is over its budget
        (``MAX_PER_TRIPLE`` unless its module states another: ``distance_budget``)."""
        if self.per_triple is None:
            return True
        return not (self.loop_mix or {}).get("SHFL") and self.per_triple <= self.triple_budget


def _label_fields(label: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in label.split()[1:] if "=" in part)


def in_fast_subset(label: str) -> bool:
    fields = _label_fields(label)
    if "e" in fields and fields["e"] != fields.get("d", fields.get("m")):
        return False
    return all(fields[k] in allowed for k, allowed in FAST.items() if k in fields)


def _matches(word: str, label: str) -> bool:
    words = label.split()
    return word in words or ("=" not in word and words[0].startswith(word))


def collect(modules=MODULES, d_max: int = 128, m_max: int = 128, subset: str | None = None,
            match: str | None = None, kernels: str | None = None) -> list[tuple]:
    """Every (kernel, signature, constexprs, num_warps, num_stages, label[, options]) of ``modules`` (in the fast
    subset, and matching every word of ``match``, when given: a ``key=value`` word or a whole family
    name is one of the label's words, any other word begins the family name, e.g. ``norm`` for every
    normalisation kernel; with ``kernels``, a comma-separated list of kernel family names, only the labels whose
    ``kid=`` is one of theirs: the specialisations of those families, none of the family-independent kernels)."""
    families = None
    if kernels is not None:
        from laplacianformer.ops.kernel_families import kernel_spec

        families = {str(kernel_spec(name).id) for name in kernels.split(",")}
    specs = []
    for name in modules:
        mod = importlib.import_module(name)
        for spec in mod.aot_specialisations(d_max=d_max, m_max=m_max):
            if subset == "fast" and not in_fast_subset(spec[5]):
                continue
            if match and not all(_matches(w, spec[5]) for w in match.split()):
                continue
            if families is not None and _label_fields(spec[5]).get("kid") not in families:
                continue
            specs.append(spec)
    return specs


_PTXAS_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


def parse_ptxas_log(log: str) -> dict[str, int]:
    out = {}
    for key, rx in _PTXAS_RE.items():
        found = rx.search(log)
        if found:
            out[key] = int(found.group(1))
    return out


def _ptxas_log(ptx: str, arch: int) -> str:
    """ptxas -v on ``ptx`` with the flags Triton uses (for a compile served from Triton's cache)."""
    from triton import knobs

    gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}",
               str(src), "-o", str(Path(tmp) / "k.o")]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stderr


BLOCKING_KEYS = {"R", "C", "TN", "TM", "KU", "SPLIT"}
"""Constexprs shown in the config column besides BLOCK*/NUM*/TILE* (the register blocking of a distance)."""

CLASSES = [
    ("SHFL", ("SHFL",)),
    ("FP32", ("FADD", "FFMA", "FMUL", "FMNMX", "FSEL", "FSETP", "FSET", "FCHK", "FRND", "FSWZADD")),
    ("MUFU", ("MUFU",)),
    ("MMA", ("HMMA", "HGMMA", "WGMMA", "IMMA", "DMMA", "BMMA", "UTC")),
    ("LDG", ("LDG", "LD", "LDGSTS", "LDGDEPBAR", "UBLKCP", "UTMALDG")),
    ("STG", ("STG", "ST", "RED", "ATOMG", "ATOM")),
    ("LDS", ("LDS", "LDSM")),
    ("STS", ("STS", "STSM")),
    ("BAR", ("BAR", "DEPBAR", "WARPSYNC", "SYNCS", "MEMBAR")),
    ("UNIFORM", ("U", "S2UR", "R2UR", "LDCU")),
    ("CONTROL", ("BRA", "EXIT", "NOP", "BSSY", "BSYNC", "RET", "CALL", "YIELD", "BPT", "JMP", "WARPGROUP")),
    ("F16/CVT", ("HADD2", "HFMA2", "HMUL2", "F2F", "F2I", "I2F", "F2FP", "HSETP2")),
    ("INT", ("IMAD", "IADD3", "IADD", "LEA", "LOP3", "SHF", "ISETP", "IABS", "IMNMX", "SEL", "MOV", "PRMT",
             "SGXT", "CS2R", "S2R", "LDC", "POPC", "FLO", "BMSK", "P2R", "R2P", "PLOP3", "VOTE", "IMUL", "I2I")),
]
"""Opcode classes of the SASS mix, in matching order: an opcode (its name before the first '.') joins the
first class one of whose prefixes it equals ('U' and 'LDCU': the uniform datapath, any U* opcode); the rest
count as OTHER."""

_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH_TARGET = re.compile(r"`?\(?(\.L_x_\d+)\)?")


def opcode_class(opcode: str) -> str:
    base = opcode.split(".")[0]
    for name, prefixes in CLASSES:
        if base in prefixes or (name == "UNIFORM" and base.startswith("U")):
            return name
    return "OTHER"


def parse_sass(text: str) -> tuple[list[tuple[int, str, str]], dict[str, int]]:
    """(instructions as (address, opcode, operands), labels -> address) of nvdisasm's listing."""
    instrs, labels, pending = [], {}, []
    for line in text.splitlines():
        lab = _SASS_LABEL.match(line.strip())
        if lab:
            pending.append(lab.group(1))
            continue
        m = _SASS_LINE.match(line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            instrs.append((addr, m.group(2), m.group(3)))
    return instrs, labels


def inner_loop(instrs: list[tuple[int, str, str]], labels: dict[str, int],
               densest: bool = False) -> list[tuple[int, str, str]]:
    """The body of the innermost back-edge (see the module docstring); the whole kernel without one. With
    ``densest`` (a distance kernel), the innermost loop with the largest share of fp32 arithmetic instead, at any
    depth: the distance loop, where a kernel also has other loops as deep (a conv's taps, a product's chunks)."""
    loops = []
    for addr, op, rest in instrs:
        if op.split(".")[0] == "BRA":
            t = _BRANCH_TARGET.search(rest)
            target = labels.get(t.group(1)) if t else None
            if target is not None and target < addr:  # not the `BRA` to itself after EXIT
                loops.append((target, addr))
    inner = [(a, b) for a, b in loops if not any((a, b) != (c, d) and a <= c and d <= b for c, d in loops)]
    if not inner:
        return list(instrs)
    depth = {lp: sum(c <= lp[0] and lp[1] <= d for c, d in loops) for lp in inner}
    if densest:
        def share(lp):
            body = [opcode_class(op) for a, op, _ in instrs if lp[0] <= a <= lp[1]]
            return body.count("FP32") / len(body)
        lo, hi = max(inner, key=lambda lp: (share(lp), lp[1] - lp[0]))
        return [i for i in instrs if lo <= i[0] <= hi]
    lo, hi = max(inner, key=lambda lp: (depth[lp], lp[1] - lp[0]))
    return [i for i in instrs if lo <= i[0] <= hi]


def class_counts(instrs: list[tuple[int, str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, op, _ in instrs:
        c = opcode_class(op)
        out[c] = out.get(c, 0) + 1
    return out


def disassemble(cubin: bytes) -> str:
    """nvdisasm's SASS listing of ``cubin`` (the nvdisasm bundled with Triton)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([knobs.nvidia.nvdisasm.path, "-c", str(path)], capture_output=True, text=True,
                              check=True).stdout


def sass_mix(cubin: bytes, distance: bool = False) -> tuple[dict[str, int], dict[str, int], int]:
    """(class counts of the kernel, class counts of its inner loop, inner-loop instructions); ``distance``: the
    loop is the distance loop (``inner_loop(densest=True)``)."""
    instrs, labels = parse_sass(disassemble(cubin))
    body = inner_loop(instrs, labels, densest=distance)
    return class_counts(instrs), class_counts(body), len(body)


def _module_of(kernel):
    fn = getattr(kernel, "fn", kernel)
    return sys.modules.get(getattr(fn, "__module__", ""), None)


def distance_triples(kernel) -> "callable | None":
    """The module's ``DISTANCE_LOOPS`` entry for ``kernel`` (a distance kernel), else None."""
    return getattr(_module_of(kernel), "DISTANCE_LOOPS", {}).get(kernel.__name__)


def distance_budget(kernel, constexprs: dict, label: str) -> float:
    """The most instructions per triple ``kernel``'s distance loop may cost for this specialisation: the
    module's ``distance_budget(constexprs, label fields)`` where it states one (with its argument in
    docs/KERNELS.md), else ``MAX_PER_TRIPLE``."""
    budget = getattr(_module_of(kernel), "distance_budget", None)
    return MAX_PER_TRIPLE if budget is None else budget(constexprs, _label_fields(label))


def compile_one(spec: tuple, arch: int) -> Row:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    kernel, signature, constexprs, warps, stages, label, *more = spec
    extra = dict(more[0]) if more else {}
    family = label.split()[0]
    config = " ".join([f"{k}={v}" for k, v in constexprs.items()
                       if k.isupper() and (k.startswith(("BLOCK", "NUM", "TILE")) or k in BLOCKING_KEYS)]
                      + [f"{k}={v}" for k, v in extra.items()])
    row = Row(f"sm_{arch}", family, label, config, warps, stages, shared_limit=SHARED_LIMIT[arch])
    sig = {}
    for name in kernel.arg_names:
        sig[name] = "constexpr" if name in constexprs else signature[name]
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if sig[name].startswith("*")}
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    buf = io.StringIO()
    t0 = time.perf_counter()
    try:
        old = knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
        try:
            with contextlib.redirect_stdout(buf):
                compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                          options={"num_warps": warps, "num_stages": stages, **extra})
        finally:
            knobs.nvidia.dump_ptxas_log = old
    except Exception as exc:  # a compile failure is a result
        row.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
        row.seconds = round(time.perf_counter() - t0, 2)
        return row
    row.seconds = round(time.perf_counter() - t0, 2)
    log = buf.getvalue()
    if "Used" not in log:  # served from Triton's cache: ptxas did not run
        row.cached = True
        log = _ptxas_log(compiled.asm["ptx"], arch)
    for key, value in parse_ptxas_log(log).items():
        setattr(row, key, value)
    row.spill_stores = row.spill_stores or 0
    row.spill_loads = row.spill_loads or 0
    row.shared = int(compiled.metadata.shared)
    triples = distance_triples(kernel)
    count = None if triples is None else triples(constexprs)
    row.mix, row.loop_mix, row.loop_instructions = sass_mix(compiled.asm["cubin"], distance=count is not None)
    if count is not None:
        row.per_triple = round(row.loop_instructions * 32 * warps / count, 3)
        row.triple_budget = distance_budget(kernel, constexprs, label)
    return row


def summarise(rows: list[Row]) -> list[list]:
    """[target, family, specialisations, spilling, over shared limit, failed, max registers, max spill, max shared]."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.target, r.family), []).append(r)
    out = []
    for (target, family), rs in sorted(groups.items()):
        ok = [r for r in rs if r.error is None]
        out.append([
            target, family, len(rs), sum(r.spill > 0 for r in ok),
            sum((r.shared or 0) > (r.shared_limit or 0) for r in ok), len(rs) - len(ok),
            max((r.registers or 0) for r in ok) if ok else None, max((r.spill for r in ok), default=None),
            max(((r.shared or 0) for r in ok), default=None),
        ])
    return out


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


ROW_HEADER = ["target", "kernel", "config", "warps", "stages", "registers", "spill bytes", "shared bytes", "compile s",
              "SASS mix", "inner loop", "instr/triple"]
SUMMARY_HEADER = ["target", "kernel family", "specialisations", "spilling", "shared > limit", "failed",
                  "max registers", "max spill bytes", "max shared bytes"]


def _mix_cell(mix: dict[str, int] | None) -> str:
    if not mix:
        return ""
    return " ".join(f"{k}:{v}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1]))


def row_cells(r: Row) -> list:
    spill = f"{r.spill_stores}/{r.spill_loads}" if r.spill else 0
    secs = f"{r.seconds}{' (cached)' if r.cached else ''}"
    if r.error:
        return [r.target, r.label, r.config, r.warps, r.stages, "FAILED", r.error, "", secs, "", "", ""]
    triple = "" if r.per_triple is None else f"{r.per_triple}{'' if r.distance_ok() else ' (over)'}"
    return [r.target, r.label, r.config, r.warps, r.stages, r.registers, spill, r.shared, secs,
            _mix_cell(r.mix), f"{r.loop_instructions}: {_mix_cell(r.loop_mix)}", triple]


def cell_name(module: str) -> str:
    """A module's cell file stem: ``laplacianformer.ops.kernel.triton`` -> ``kernel_triton``."""
    return module.removeprefix("laplacianformer.ops.").replace(".", "_")


def write_json(path: Path, argv, summary: list[list], rows: list[Row], verdict: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "command": "python -m benchmarks.triton_aot " + " ".join(argv if argv is not None else sys.argv[1:]),
        "triton": __import__("triton").__version__, "shared_limit": SHARED_LIMIT,
        "summary_header": SUMMARY_HEADER, "summary": summary,
        "rows": [asdict(r) for r in rows], "verdict": verdict,
    }, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="80,90", help="compute capabilities, comma-separated (default 80,90)")
    ap.add_argument("--strict", action="store_true", help="also fail on any spill or shared memory over the limit")
    ap.add_argument("--subset", choices=["all", "fast"], default="all")
    ap.add_argument("--d-max", type=int, default=128)
    ap.add_argument("--m-max", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None, help="write the rows and the summary here")
    ap.add_argument("--md", type=Path, default=None, help="write the Markdown tables here")
    ap.add_argument("--match", default=None, help="only labels matching every word: key=value words and family names are words of the label, "
                    "other words begin the family (e.g. 'matmul_fwd d=128 dtype=fp32', 'norm m=64')")
    ap.add_argument("--kernel", default=None, help="only these kernel families' specialisations, comma-separated "
                    "names (labels kid=ID; e.g. 'exponential,matern32,cauchy')")
    ap.add_argument("--module", action="append", default=None, help="module to collect (default: MODULES)")
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    ap.add_argument("--cells", type=Path, default=None, help="resumable: one cell per module and target, written "
                    "to CELLS/<module>_sm<arch>.json when it finishes; a cell already there is read, not compiled "
                    "again; the summary covers every cell")
    args = ap.parse_args(argv)
    archs = [int(a) for a in args.arch.split(",") if a]
    for a in archs:
        if a not in SHARED_LIMIT:
            ap.error(f"--arch: expected among {sorted(SHARED_LIMIT)}, got {a}")
    modules = args.module or MODULES
    subset = None if args.subset == "all" else args.subset
    rows: list[Row] = []
    read = 0  # rows read from cells (--cells), not compiled by this run
    t0 = time.perf_counter()

    def compile_all(specs, arch) -> list[Row]:
        out = []
        for spec in specs:
            out.append(compile_one(spec, arch))
            if not args.quiet:
                print(" | ".join(str(c) for c in row_cells(out[-1])), flush=True)
        return out

    if args.cells:
        for arch in archs:
            for module in modules:
                path = args.cells / f"{cell_name(module)}_sm{arch}.json"
                if path.exists():
                    cell = [Row(**r) for r in json.loads(path.read_text())["rows"]]
                    rows += cell
                    read += len(cell)
                    print(f"triton_aot: {path.name} read ({time.perf_counter() - t0:.0f} s)", flush=True)
                    continue
                specs = collect([module], args.d_max, args.m_max, subset, args.match, args.kernel)
                cell = compile_all(specs, arch)
                write_json(path.with_suffix(".tmp"), argv, summarise(cell), cell, f"{len(cell)} compiles")
                path.with_suffix(".tmp").replace(path)  # a cell is whole or absent
                print(f"triton_aot: {path.name}: {len(cell)} compiles ({time.perf_counter() - t0:.0f} s)", flush=True)
                rows += cell
    else:
        specs = collect(modules, args.d_max, args.m_max, subset, args.match, args.kernel)
        print(f"triton_aot: {len(specs)} specialisations x {len(archs)} targets", flush=True)
        for arch in archs:
            rows += compile_all(specs, arch)
    summary = summarise(rows)
    failed = [r for r in rows if r.error]
    unfit = [r for r in rows if r.error is None and not r.fits()]
    print()
    print(_table(SUMMARY_HEADER, summary))
    slow = [r for r in rows if r.error is None and not r.distance_ok()]
    big = [r for r in rows if r.error is None and (r.spill or (r.shared or 0) > (r.shared_limit or 0))]
    overfull = [r for r in rows if r.error is None and not r.registers_fit()]
    cells = f" ({read} read from --cells)" if read else ""
    verdict = (f"{len(rows)} compiles{cells} in {time.perf_counter() - t0:.0f} s: {len(failed)} failed, "
               f"{len(big)} spill or exceed shared memory, {len(overfull)} exceed the register file "
               f"(registers x threads > {REGISTER_FILE}), {len(slow)} distance loops with SHFL "
               f"or over their instructions-per-triple budget")
    print(verdict)
    if args.json:
        write_json(args.json, argv, summary, rows, verdict)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text("## Summary\n\n" + _table(SUMMARY_HEADER, summary) + "\n\n" + verdict + "\n\n## Every specialisation\n\n"
                           + _table(ROW_HEADER, [row_cells(r) for r in rows]) + "\n")
    if failed:
        return 1
    if args.strict and unfit:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
