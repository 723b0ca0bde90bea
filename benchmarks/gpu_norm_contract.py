#!/usr/bin/env python3
"""On a CUDA GPU: the real in-place ``fused_add_rmsnorm`` against the CPU tier's stand-in.

SGLang's GPU norm (``RMSNorm.forward_cuda`` -> ``fused_add_rmsnorm``) is
FlashInfer's kernel; the CPU tier's stand-in for the AMX op of the same
contract is ``fused_add_rmsnorm_cpu`` in
``pytest_eagle3/worker/cpu/shim/sgl_kernel/_norm.py``.  For bf16, fp16 and fp32,
T in {1, 7, 64} tokens and H in {256, 7168}, this checks on the GPU:

(a) the kernel overwrites ``input`` and ``residual`` in place and returns None;
(b) the normalized output is computed from the unrounded fp32 sum (what the
    stand-in does) rather than from the residual rounded to the dtype;
(c) a residual kept as a view from the previous layer holds the next layer's
    sum after the next call (the aliasing of SGLang PR #39286); a ``.clone()``
    keeps its value.

Needs ``flashinfer-python`` (0.5.3, compiled by nvcc at first use: about 15 s)
and ``apache-tvm-ffi`` importable; installs nothing.  Run from the repository
root: ``python3 benchmarks/gpu_norm_contract.py``.  Writes ``$OUT/norm_check.json``
(``./norm_check.json`` if ``OUT`` is unset) and prints two tables.  Measured on
an H200 (torch 2.11, CUDA 13.0): docs/cpu-tier.md, "In-place norms and fused
all-reduce".
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback

T0 = time.time()
OUT = os.environ.get("OUT") or "."
DEV = os.environ.get("CHECK_NORM_DEVICE", "cuda")  # "cpu" only for a dry run of the logic
RESULT: dict = {"env": {}, "setup": {}, "cases": [], "alias": [], "errors": []}


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def dump():
    try:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "norm_check.json"), "w") as f:
            json.dump(RESULT, f, indent=1, default=str)
    except Exception as e:  # noqa: BLE001
        print("could not write JSON:", e, flush=True)


# ---------------------------------------------------------------- environment for the JIT
def _find_cuda_home() -> str | None:
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    cands += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    nvcc = shutil.which("nvcc")
    if nvcc:
        # /usr/local/bin/nvcc may be a wrapper script: read the real path out of it
        try:
            txt = open(nvcc, "rb").read(4096).decode("utf-8", "replace")
            for tok in txt.split():
                if tok.endswith("/bin/nvcc"):
                    cands.append(os.path.dirname(os.path.dirname(tok)))
        except Exception:  # noqa: BLE001
            pass
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for c in cands:
        if c and os.path.isfile(os.path.join(c, "bin", "nvcc")) and \
                os.path.isfile(os.path.join(c, "include", "cuda_runtime.h")):
            return c
    return None


def _site_dirs() -> list[str]:
    out = []
    for p in sys.path + [sysconfig.get_paths().get("purelib", ""), sysconfig.get_paths().get("platlib", "")]:
        if p and os.path.isdir(os.path.join(p, "nvidia")) and p not in out:
            out.append(p)
    return out


def setup_env() -> None:
    ws = os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/fi_ws")
    os.makedirs(ws, exist_ok=True)
    os.environ.setdefault("TVM_FFI_CACHE_DIR", "/tmp/tvm_ffi_cache")
    cuda_home = _find_cuda_home()
    RESULT["setup"]["cuda_home"] = cuda_home
    if cuda_home:
        os.environ["CUDA_HOME"] = cuda_home
        try:
            RESULT["setup"]["nvcc"] = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                                                     capture_output=True, text=True).stdout.strip().splitlines()[-1]
        except Exception as e:  # noqa: BLE001
            RESULT["setup"]["nvcc"] = repr(e)
    inc = os.path.join(cuda_home, "include") if cuda_home else "/nonexistent"
    # flashinfer's norm.cuh pulls in cublasLt.h and curand_kernel.h; an nvcc-only toolkit lacks them.
    # Fill the gaps from the pip nvidia-* wheels torch brought (headers only, never shadowing the toolkit's).
    shim_inc = tempfile.mkdtemp(prefix="fi_inc_")
    linked = []
    need = ["cublasLt.h", "curand_kernel.h"]
    src_dirs = [d for sd in _site_dirs() for d in sorted(glob.glob(os.path.join(sd, "nvidia", "*", "include")))]
    # last resort: cublas*/curand* headers from a cu13 nvidia wheel, carried next to this script
    src_dirs.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_inc_fallback"))
    for d in src_dirs:
        if not os.path.isdir(d):
            continue
        for h in os.listdir(d):
            if h.endswith(".h") and not os.path.exists(os.path.join(inc, h)) and \
                    not os.path.exists(os.path.join(shim_inc, h)):
                os.symlink(os.path.join(d, h), os.path.join(shim_inc, h))
                linked.append(os.path.join(d, h))
    missing = [h for h in need if not (os.path.exists(os.path.join(inc, h)) or os.path.exists(os.path.join(shim_inc, h)))]
    RESULT["setup"]["extra_headers_linked"] = len(linked)
    RESULT["setup"]["extra_header_dirs"] = sorted({os.path.dirname(p) for p in linked})
    RESULT["setup"]["headers_still_missing"] = missing
    # -lcuda: the toolkit may have no stubs/ and the driver may ship only libcuda.so.1.
    shim_lib = tempfile.mkdtemp(prefix="fi_lib_")
    libcuda = None
    if cuda_home and (glob.glob(os.path.join(cuda_home, "lib64", "libcuda.so")) or
                      glob.glob(os.path.join(cuda_home, "lib64", "stubs", "libcuda.so"))):
        libcuda = "toolkit"
    else:
        try:
            ld = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
        except Exception:  # noqa: BLE001
            ld = ""
        cands = [ln.split("=>")[-1].strip() for ln in ld.splitlines() if "libcuda.so" in ln and "x86-64" in ln]
        cands += glob.glob("/usr/lib/x86_64-linux-gnu/libcuda.so*") + glob.glob("/usr/lib64/libcuda.so*")
        cands = [c for c in cands if os.path.exists(c)]
        if cands:
            libcuda = sorted(cands, key=len)[0]
            os.symlink(libcuda, os.path.join(shim_lib, "libcuda.so"))
        else:  # empty stub with the driver's soname: resolved against the real driver at load time
            r = subprocess.run(["c++", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-x", "c++", "/dev/null",
                                "-o", os.path.join(shim_lib, "libcuda.so")], capture_output=True, text=True)
            libcuda = "stub" if r.returncode == 0 else f"stub failed: {r.stderr[-300:]}"
    RESULT["setup"]["libcuda_for_link"] = libcuda
    os.environ["FLASHINFER_EXTRA_CUDAFLAGS"] = (os.environ.get("FLASHINFER_EXTRA_CUDAFLAGS", "") +
                                                f" -isystem {shim_inc}").strip()
    os.environ["FLASHINFER_EXTRA_LDFLAGS"] = (os.environ.get("FLASHINFER_EXTRA_LDFLAGS", "") +
                                              f" -L{shim_lib}").strip()
    os.environ.setdefault("MAX_JOBS", str(min(16, os.cpu_count() or 4)))
    # flashinfer runs `ninja` from PATH: make the pip ninja next to this python reachable
    path = [os.path.dirname(sys.executable)]
    try:
        import ninja  # noqa: PLC0415
        path.append(ninja.BIN_DIR)
    except Exception:  # noqa: BLE001
        pass
    os.environ["PATH"] = os.pathsep.join(path + [os.environ.get("PATH", "")])
    RESULT["setup"]["ninja"] = shutil.which("ninja")
    RESULT["setup"]["cxx"] = shutil.which(os.environ.get("CXX", "c++"))
    for k in ("CUDA_HOME", "FLASHINFER_WORKSPACE_BASE", "TVM_FFI_CACHE_DIR", "FLASHINFER_EXTRA_CUDAFLAGS",
              "FLASHINFER_EXTRA_LDFLAGS", "FLASHINFER_CUDA_ARCH_LIST", "MAX_JOBS"):
        RESULT["setup"][k] = os.environ.get(k)
    log("setup", json.dumps(RESULT["setup"], default=str))


def load_standin():
    path = os.path.join("pytest_eagle3", "engine", "cpu", "shim", "sgl_kernel", "_norm.py")
    spec = importlib.util.spec_from_file_location("_pe3_norm_standin", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- checks
def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


def stats(a, b):
    """max abs diff, fraction of bit-identical elements."""
    d = (a.float() - b.float()).abs()
    return float(d.max()), float((a == b).float().mean())


def run_case(torch, fi, standin, dtype, T, H, eps=1e-6, seed=0):
    rec = {"dtype": str(dtype).replace("torch.", ""), "T": T, "H": H}
    g = torch.Generator(device=DEV).manual_seed(seed + 1000 * T + H)
    x = torch.randn(T, H, device=DEV, dtype=torch.float32, generator=g).to(dtype)
    # a residual stream much larger than the layer output: rounding the sum to dtype then matters
    r = (torch.randn(T, H, device=DEV, dtype=torch.float32, generator=g) * 8).to(dtype)
    w = (1 + 0.1 * torch.randn(H, device=DEV, dtype=torch.float32, generator=g)).to(dtype)

    # (a) real kernel, in place?
    xi, ri = x.clone(), r.clone()
    px, pr = xi.data_ptr(), ri.data_ptr()
    try:
        ret = fi.fused_add_rmsnorm(xi, ri, w, eps)
        sync(torch)
    except Exception as e:  # noqa: BLE001
        rec["kernel_error"] = f"{type(e).__name__}: {str(e).strip()[-1500:]}"
        return rec
    rec["returns_none"] = ret is None
    rec["ptrs_kept"] = xi.data_ptr() == px and ri.data_ptr() == pr
    rec["input_overwritten"] = not torch.equal(xi, x)
    rec["residual_overwritten"] = not torch.equal(ri, r)
    sum32 = x.float() + r.float()
    rounded = sum32.to(dtype)
    rec["residual_vs_rounded_sum_maxdiff"], rec["residual_vs_rounded_sum_eqfrac"] = stats(ri, rounded)

    # (b) stand-in (unrounded fp32 sum) and the rounded-residual variant
    xs, rs = x.clone(), r.clone()
    sret = standin.fused_add_rmsnorm_cpu(xs, rs, w, eps)
    sync(torch)
    rec["standin_returns_none"] = sret is None
    rec["standin_residual_equal"] = torch.equal(rs, ri)
    nrm = standin._normed
    out_rounded = (nrm(rounded.float(), eps) * w.float()).to(dtype)
    rec["out_vs_standin_unrounded_maxdiff"], rec["out_vs_standin_unrounded_eqfrac"] = stats(xi, xs)
    rec["out_vs_rounded_residual_maxdiff"], rec["out_vs_rounded_residual_eqfrac"] = stats(xi, out_rounded)
    # float64 references, for scale
    ref64_u = (nrm(sum32.double(), eps) * w.double())
    ref64_r = (nrm(rounded.double(), eps) * w.double())
    rec["kernel_vs_fp64_unrounded_maxdiff"] = float((xi.double() - ref64_u).abs().max())
    rec["kernel_vs_fp64_rounded_maxdiff"] = float((xi.double() - ref64_r).abs().max())
    du, dr = rec["kernel_vs_fp64_unrounded_maxdiff"], rec["kernel_vs_fp64_rounded_maxdiff"]
    eu, er = rec["out_vs_standin_unrounded_eqfrac"], rec["out_vs_rounded_residual_eqfrac"]
    rec["closer_to"] = ("unrounded" if (eu > er or (eu == er and du < dr)) else
                        "rounded" if (er > eu or (eu == er and dr < du)) else "tie")
    return rec


def run_alias(torch, fi, standin, dtype, T, H, eps=1e-6, impl="kernel"):
    """(c): layer 1 writes the residual; a capture kept as a view is overwritten by layer 2."""
    rec = {"impl": impl, "dtype": str(dtype).replace("torch.", ""), "T": T, "H": H}
    call = fi.fused_add_rmsnorm if impl == "kernel" else standin.fused_add_rmsnorm_cpu
    g = torch.Generator(device=DEV).manual_seed(7 + T + H)
    hid = [torch.randn(T, H, device=DEV, generator=g).to(dtype) for _ in range(3)]
    w = torch.ones(H, device=DEV, dtype=dtype)
    residual = hid[0].clone()
    x1 = hid[1].clone()
    call(x1, residual, w, eps)                 # layer 1: residual <- h0 + h1
    cap_view = residual                        # capture kept as a view (no clone)
    cap_slice = residual[:, : H // 2]          # a sliced view too
    cap_clone = residual.clone()
    after_l1 = residual.clone()
    x2 = hid[2].clone()
    call(x2, residual, w, eps)                 # layer 2: residual <- (h0 + h1) + h2
    sync(torch)
    new_sum = (after_l1.float() + hid[2].float()).to(dtype)
    rec["view_same_storage"] = cap_view.data_ptr() == residual.data_ptr()
    rec["view_now_holds_layer2_sum"] = torch.equal(cap_view, new_sum)
    rec["slice_view_now_holds_layer2_sum"] = torch.equal(cap_slice, new_sum[:, : H // 2])
    rec["clone_kept_layer1_value"] = torch.equal(cap_clone, after_l1)
    rec["clone_differs_from_residual"] = not torch.equal(cap_clone, residual)
    return rec


def print_tables():
    cols = ["dtype", "T", "H", "returns_none", "ptrs_kept", "input_overwritten", "residual_overwritten",
            "residual_vs_rounded_sum_maxdiff", "out_vs_standin_unrounded_maxdiff", "out_vs_standin_unrounded_eqfrac",
            "out_vs_rounded_residual_maxdiff", "out_vs_rounded_residual_eqfrac", "closer_to"]
    short = ["dtype", "T", "H", "none", "ptrs", "in_ow", "res_ow", "res-rnd", "d_unrnd", "eq_unrnd",
             "d_rnd", "eq_rnd", "closer"]

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    rows = []
    for rec in RESULT["cases"]:
        if "kernel_error" in rec or "case_error" in rec:
            lines = [ln for ln in (rec.get("kernel_error") or rec.get("case_error", "")).splitlines() if ln.strip()]
            pick = [ln for ln in lines if "dtype" in ln.lower()] or lines[-1:] or [""]
            rows.append([rec.get("dtype"), rec.get("T"), rec.get("H"), ("ERR " + pick[-1].strip())[:140]])
        else:
            rows.append([fmt(rec.get(c)) for c in cols])
    print()
    print(" | ".join(short))
    for r in rows:
        print(" | ".join(map(str, r)))
    print()
    acols = ["impl", "dtype", "view_same_storage", "view_now_holds_layer2_sum", "slice_view_now_holds_layer2_sum",
             "clone_kept_layer1_value", "clone_differs_from_residual", "error"]
    print(" | ".join(acols))
    for rec in RESULT["alias"]:
        print(" | ".join(fmt(rec.get(c, "")) for c in acols))
    print()


def main() -> int:
    setup_env()
    import torch
    RESULT["env"]["python"] = sys.version.split()[0]
    RESULT["env"]["torch"] = torch.__version__
    RESULT["env"]["torch_cuda"] = torch.version.cuda
    RESULT["env"]["cuda_available"] = torch.cuda.is_available()
    RESULT["env"]["torch_has___dlpack_c_exchange_api__"] = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    RESULT["env"]["torch_has___c_dlpack_exchange_api__"] = hasattr(torch.Tensor, "__c_dlpack_exchange_api__")
    if torch.cuda.is_available():
        RESULT["env"]["device"] = torch.cuda.get_device_name(0)
        RESULT["env"]["capability"] = torch.cuda.get_device_capability(0)
    log("env", json.dumps(RESULT["env"], default=str))

    standin = load_standin()
    log("stand-in loaded from", standin.__file__)

    t = time.time()
    try:
        import tvm_ffi  # noqa: F401
        import flashinfer
        RESULT["env"]["flashinfer"] = flashinfer.__version__
        RESULT["env"]["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        RESULT["errors"].append("import flashinfer: " + traceback.format_exc()[-3000:])
        log("import flashinfer failed:", repr(e))
        dump()
        return 1
    RESULT["setup"]["import_s"] = round(time.time() - t, 2)
    log(f"import flashinfer {RESULT['env']['flashinfer']} / tvm_ffi {RESULT['env']['tvm_ffi']}: "
        f"{RESULT['setup']['import_s']}s")
    if not torch.cuda.is_available():
        RESULT["errors"].append("no CUDA device: stopping after imports")
        log("no CUDA device; stopping after the imports")
        dump()
        return 2

    t = time.time()
    try:
        from flashinfer.norm import get_norm_module
        get_norm_module()
        RESULT["setup"]["jit_compile_s"] = round(time.time() - t, 2)
        log(f"JIT compile+load of the norm module: {RESULT['setup']['jit_compile_s']}s")
    except Exception as e:  # noqa: BLE001
        RESULT["setup"]["jit_compile_s"] = None
        RESULT["errors"].append("JIT: " + traceback.format_exc()[-6000:])
        log("JIT build failed:", traceback.format_exc()[-6000:])
        dump()
        return 1
    t = time.time()
    get_norm_module()
    RESULT["setup"]["jit_second_call_s"] = round(time.time() - t, 4)

    dtypes = [torch.bfloat16, torch.float16, torch.float32]
    for dtype in dtypes:
        for T in (1, 7, 64):
            for H in (256, 7168):
                try:
                    rec = run_case(torch, flashinfer, standin, dtype, T, H)
                except Exception:  # noqa: BLE001
                    rec = {"dtype": str(dtype).replace("torch.", ""), "T": T, "H": H, "case_error": traceback.format_exc()[-1500:]}
                RESULT["cases"].append(rec)
        dump()
    for dtype in dtypes:
        for impl in ("kernel", "standin"):
            try:
                rec = run_alias(torch, flashinfer, standin, dtype, 7, 7168, impl=impl)
            except Exception as e:  # noqa: BLE001
                rec = {"impl": impl, "dtype": str(dtype).replace("torch.", ""), "error": f"{type(e).__name__}: {str(e)[:300]}"}
            RESULT["alias"].append(rec)
    dump()

    print_tables()
    log("JSON written to", os.path.join(OUT, "norm_check.json"))
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception:  # noqa: BLE001
        RESULT["errors"].append(traceback.format_exc()[-3000:])
        print(traceback.format_exc(), flush=True)
        rc = 1
    dump()
    sys.exit(rc)
