"""The code of the child processes benchmarks/gpu/_quantize.py and benchmarks/gpu/_search.py run with
`python3 -c` (their _child: src/ on the path, a timeout), so that a run that fails, runs out of memory or is killed at
its timeout takes nothing of the parent process with it:

    QUANT_CHILD   argv: model, out, options (JSON)    one instrumented `matgptq.quantize` run (_quantize)
    AGREE_CHILD   argv: model, work, calib, options  a small float32 Llama quantized on the device and on the CPU,
                                                     their codes compared (tests/quantization/test_cuda.py's bounds)
    SCORE_CHILD   argv: parent, calib, options       the search's scoring throughput (_search)
    CLI_CHILD     argv: a matgptq command line           the command itself, `@@result {}` once it exits 0
                                                     (_search's search run)

Each prints its result as one `@@result {JSON}` line on stdout and what it finished as it goes (per block and per
layer) as `@@progress {JSON}` lines on stderr (_PREFIX's _note), so that a child killed at its timeout still tells how
far it got. On the GPU, the children synchronise around the Hessian hooks and the solver calls so the stage seconds
are the device's, not the launches'.
"""

_PREFIX = """
import dataclasses, json, platform, re, sys, time, traceback
import torch

def _sync():
    if CUDA:
        torch.cuda.synchronize()

def _rss():
    try:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
    except Exception:
        return None

def _device_name():
    return torch.cuda.get_device_name() if CUDA else (platform.processor() or platform.machine() or "cpu")

def _note(kind, **kw):
    print("@@progress " + json.dumps({"kind": kind, **kw}), file=sys.stderr, flush=True)
"""

QUANT_CHILD = (
    _PREFIX
    + """
model, out, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
device = opts.pop("device")
CUDA = device.startswith("cuda")
import matgptq
from matgptq.formats.staged import StagedCheckpoint
from matgptq.models.lazy import LazyModel
from matgptq.quantization import layer, passes, pipeline, resume
from matgptq.quantization.algorithm import hessian
from matgptq.quantization import run as qrun

stages, blocks, active, times = {}, [], [], {}

def wrap(owner, attr, key, sync_before=False, done=None):
    orig = getattr(owner, attr, None)
    if orig is None:
        return
    def wrapper(*a, **k):
        if sync_before:
            _sync()
        t0 = time.perf_counter()
        result = orig(*a, **k)
        _sync()
        dt = time.perf_counter() - t0
        stages[key] = stages.get(key, 0.0) + dt
        if done is not None:
            done(a, result, dt)
        return result
    setattr(owner, attr, wrapper)
    active.append(key)

def block_done(a, result, dt):
    blocks.append(dt)
    _note("block", index=a[2], seconds=dt)

def layer_done(a, result, dt):
    r = result[1]
    _note("layer", name=r.name, seconds=r.seconds, wall=dt, shape=list(r.shape))

def times_done(a, result, dt):
    times.update(dataclasses.asdict(result.times))

wrap(qrun, "_windows", "windows")
wrap(qrun, "_open", "open")
wrap(qrun, "quantize_model", "quantize_model", done=times_done)
wrap(pipeline, "block_inputs", "capture", sync_before=True)
wrap(LazyModel, "load_block", "load_block")
wrap(pipeline, "_quantize_block", "blocks", sync_before=True, done=block_done)
wrap(pipeline, "_solve", "solve_wall", sync_before=True, done=layer_done)
wrap(layer, "gptq_quantize", "gptq")  # synchronised inside _solve's timing: StageTimes.solver is the device's
wrap(layer, "refit_master", "refit")
wrap(layer, "with_width_scales", "width_scales")
wrap(hessian.Accumulator, "add", "hessian_add")  # synchronised inside the hook's timing: StageTimes.hessian
wrap(StagedCheckpoint, "write_block", "sink_write")
wrap(StagedCheckpoint, "assemble", "assemble")
wrap(resume.BlockState, "save", "state_save")
hook = getattr(passes._Collector, "hook", None)
if hook is not None:  # the forward's pending work finishes before the hook's clock starts
    def synced_hook(self, name):
        fn = hook(self, name)
        def run(module, args):
            _sync()
            return fn(module, args)
        return run
    passes._Collector.hook = synced_hook
    active.append("hook_sync")

if CUDA:
    torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
_, reports = matgptq.quantize(model, out, device=device, progress=False, **opts)
_sync()
wall = time.perf_counter() - t0
print("@@result " + json.dumps({
    "wall": wall, "blocks": blocks, "stages": stages, "times": times, "instruments": active,
    "layers": [{"name": r.name, "shape": list(r.shape), "seconds": r.seconds, "damp": r.damp,
                "rel_error": {str(k): v for k, v in r.rel_error.items()}} for r in reports],
    "peak_gpu": torch.cuda.max_memory_allocated() if CUDA else None,
    "peak_reserved": torch.cuda.max_memory_reserved() if CUDA else None,
    "rss": _rss(), "device_name": _device_name(), "torch": torch.__version__}), flush=True)
"""
)

AGREE_CHILD = (
    _PREFIX
    + """
model, work, calib, opts = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
device = opts.pop("device")
CUDA = device.startswith("cuda")
import matgptq
from matgptq.formats import read_checkpoint

found = {}
for method, bits in (("gptq", 4), ("matgptq", [3, 4, 8])):
    try:
        args = dict(calib=calib, method=method, bits=bits, progress=False, **opts)
        t0 = time.perf_counter()
        matgptq.quantize(model, f"{work}/{method}-cpu", device="cpu", **args)
        t1 = time.perf_counter()
        matgptq.quantize(model, f"{work}/{method}-dev", device=device, **args)
        t2 = time.perf_counter()
        a, b = read_checkpoint(f"{work}/{method}-cpu"), read_checkpoint(f"{work}/{method}-dev")
        differ = total = worst = 0
        for name, qa in a.layers.items():
            steps = (qa.codes.long() - b.layers[name].codes.long()).abs()
            differ, total = differ + int((steps > 0).sum()), total + steps.numel()
            worst = max(worst, int(steps.max()))
        ra = json.load(open(f"{work}/{method}-cpu/matgptq.json"))["report"]
        rb = json.load(open(f"{work}/{method}-dev/matgptq.json"))["report"]
        dev = max(abs(y["rel_error"][r] - e) / max(e, 1e-12) for x, y in zip(ra, rb) for r, e in x["rel_error"].items())
        same_tensors = all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
        found[method] = {"ok": differ <= 0.10 * total and dev <= 0.05 and same_tensors,
                         "error": None, "codes": total, "differ": differ, "differ_frac": differ / max(total, 1),
                         "max_step": worst, "rel_error_max_dev": dev, "same_unquantized": same_tensors,
                         "cpu_s": t1 - t0, "device_s": t2 - t1, "device": device}
    except Exception:
        found[method] = {"ok": False, "error": traceback.format_exc()[-1500:], "device": device}
print("@@result " + json.dumps({"runs": found, "device_name": _device_name()}), flush=True)
"""
)

SCORE_CHILD = (
    _PREFIX
    + """
parent, calib, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import faulthandler
faulthandler.dump_traceback_later(opts["stack_dump_s"], exit=False)  # where it was, in the tail of a timeout
device = torch.device(opts["device"])
CUDA = device.type == "cuda"
import random
from matgptq.evaluation.teacher import Teacher
from matgptq.formats import read_checkpoint
from matgptq.models import eval_windows, load_tokenizer, read_text, tokenize
from matgptq.runtime import load
from matgptq.allocation import CostModel, ScoreDtype
from matgptq.allocation.fitness import Fitness

t_start = time.perf_counter()
ckpt = read_checkpoint(parent)
levels = tuple(range(2, max(q.master_bits for q in ckpt.layers.values()) + 1))
cost = CostModel.from_checkpoint(ckpt, levels)
seqlen, nwin = opts["seqlen"], opts["windows"]
ids = tokenize(load_tokenizer(parent), read_text(calib, tuple(opts["calib_range"])))
windows = eval_windows(ids, seqlen, nwin * seqlen)
t0 = time.perf_counter()
ref = load(ckpt.meta["source_model"], packed=False).to(device)
_note("stage", done="source model loaded", s=time.perf_counter() - t_start)
teacher = Teacher(ref, windows, opts["batch"])
del ref
_sync()
t1 = time.perf_counter()
_note("stage", done="teacher", s=t1 - t_start)
model = load(parent, bits=levels[-1], packed=False).to(device)
_sync()
t2 = time.perf_counter()
_note("stage", done="parent loaded", s=t2 - t_start)
auto = ScoreDtype.AUTO.resolve(device)
fit = Fitness(model, teacher, windows, cost.names, opts["batch"], compute_dtype=auto)
everything = tuple(range(windows.shape[0]))
rng = random.Random(0)
mix = [4 if 4 in levels else levels[-1]] * len(cost.names)  # a search's start: a uniform mix
fit.kl(tuple(mix), everything)  # warm-up: the teacher's window terms, the first forward
_sync()
t3 = time.perf_counter()
measured = {}
for dtype in dict.fromkeys((auto, torch.float32)):
    fit.compute_dtype = dtype
    fit.kl(tuple(mix), everything)  # warm-up in this dtype
    apply_s = kl_s = 0.0
    tokens0, kls = fit.tokens, []
    for _ in range(opts["candidates"]):  # a mutation: two layers change width, as EvoPress' children
        for i in rng.sample(range(len(mix)), min(2, len(mix))):
            mix[i] = rng.choice([r for r in levels if r != mix[i]])
        _sync()
        a = time.perf_counter()
        fit.apply(tuple(mix))  # runtime.set_bits: the changed layers re-sliced
        _sync()
        b = time.perf_counter()
        kls.append(fit.kl(tuple(mix), everything))
        _sync()
        apply_s, kl_s = apply_s + b - a, kl_s + time.perf_counter() - b
    tokens = fit.tokens - tokens0
    measured[str(dtype).removeprefix("torch.")] = {
        "tokens_per_s": tokens / kl_s, "tokens_per_s_with_apply": tokens / (kl_s + apply_s),
        "kl_s_per_candidate": kl_s / opts["candidates"], "apply_s_per_candidate": apply_s / opts["candidates"],
        "tokens_per_candidate": tokens // opts["candidates"], "kl": kls}
teacher.close()
print("@@result " + json.dumps({
    "levels": list(levels), "layers": len(cost.names), "windows": int(windows.shape[0]), "seqlen": seqlen,
    "score_dtype": str(auto).removeprefix("torch."), "measured": measured,
    "teacher_s": t1 - t0, "load_s": t2 - t1, "warmup_s": t3 - t2, "child_s": time.perf_counter() - t_start,
    "vocab": int(fit.head.out_features), "hidden": int(fit.body.hidden_size),
    "peak_gpu": torch.cuda.max_memory_allocated() if CUDA else None, "rss": _rss(),
    "device_name": _device_name(), "torch": torch.__version__}), flush=True)
"""
)

CLI_CHILD = """
import runpy, sys
sys.argv = ["matgptq", *sys.argv[1:]]
try:
    runpy.run_module("matgptq", run_name="__main__")
except SystemExit as e:
    if e.code not in (0, None):
        raise
print("@@result {}", flush=True)
"""
