"""What a shipped kernel computes, against a float32 torch reference: one set of checks, three places to run them.

- on porter's emulated HIP target (``porter emulate check``): the modules porter built for ``emulate-wave64`` or
  ``emulate-wave32``, run on the CPU with 64- or 32-lane wavefronts (small shapes: every GPU thread is a fiber);
- on a real GPU (``benchmarks/cuda_twin.py``, an NVIDIA GPU where one is lent): the same modules built for CUDA.

Each check calls the kernel module as its Python users do (Megatron's fused softmax and layer-norm modules,
DeepSpeed's fused optimizer op modules, through their bindings) and compares with torch in float32. A module is
found by name on ``sys.path`` and loaded from its file without importing its parent packages (DeepSpeed's
``deepspeed/__init__.py`` needs far more than the kernels). Nothing here imports porter: this file also runs as a
script in a python that has only torch.

    python checks.py --device cpu --wave 64 [--only FAMILY ...] [--out FILE]  -> one JSON list

A row: ``kernel`` (the family), ``check`` (what was compared), ``wave``, ``max_abs_err``, ``tolerance``, ``ok``,
and ``error`` when the kernel raised (on the emulated target: what it does not model, or a wrong argument).
"""

from __future__ import annotations

import argparse
import functools
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
import time
from collections.abc import Callable
from typing import Any

# the module each family's kernels are built as (Megatron's names are top-level; DeepSpeed's are its op modules)
FAMILIES: dict[str, str] = {
    "megatron.scaled_upper_triang_masked_softmax": "scaled_upper_triang_masked_softmax_cuda",
    "megatron.scaled_masked_softmax": "scaled_masked_softmax_cuda",
    "megatron.scaled_softmax": "scaled_softmax_cuda",
    "megatron.layer_norm": "fused_mix_prec_layer_norm_cuda",
    "deepspeed.fused_adam": "deepspeed.ops.adam.fused_adam_op",
    "deepspeed.fused_lamb": "deepspeed.ops.lamb.fused_lamb_op",
    "deepspeed.fused_lion": "deepspeed.ops.lion.fused_lion_op",
    "apex.amp_C": "apex.amp_C",
    "apex.fused_layer_norm": "apex.fused_layer_norm_cuda",
    "apex.syncbn": "apex.syncbn",
}


def load(module: str) -> Any | None:
    """The extension module ``module`` from the first ``sys.path`` folder that has its file; None if none has it."""
    parts = module.split(".")
    suffixes = [sysconfig.get_config_var("EXT_SUFFIX") or ".so", *importlib.machinery.EXTENSION_SUFFIXES]
    for base in sys.path:
        for suffix in suffixes:
            path = os.path.join(base or ".", *parts[:-1], parts[-1] + suffix)
            if os.path.isfile(path):
                spec = importlib.util.spec_from_file_location(module, path)
                assert spec is not None and spec.loader is not None
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
    return None


class Checks:
    """Rows of one run: ``device`` (cpu for the emulated target, cuda for a GPU) sizes the shapes."""

    def __init__(self, device: str, wave: int) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.wave = wave
        self.small = device == "cpu"
        self.rows: list[dict[str, Any]] = []

    def add(self, kernel: str, check: str, err: float, tol: float, **extra: Any) -> None:
        self.rows.append({"kernel": kernel, "check": check, "wave": self.wave, "max_abs_err": err, "tolerance": tol,
                          "ok": bool(err == err and err <= tol), **extra})

    def run(self, kernel: str, check: str, tol: float, fn: Callable[[], float]) -> None:
        """One comparison; a kernel that raises fails it, with its message (never a made-up value)."""
        start = time.monotonic()
        try:
            err = fn()
        except Exception as exc:  # noqa: BLE001 -- the kernel's own error is the finding
            text = str(exc).split("\nInvoked with:")[0]  # pybind11 would print every argument tensor
            self.rows.append({"kernel": kernel, "check": check, "wave": self.wave, "max_abs_err": None,
                              "tolerance": tol, "ok": False, "error": f"{type(exc).__name__}: {text}"[:2000]})
            return
        self.add(kernel, check, err, tol, seconds=round(time.monotonic() - start, 3))

    def err(self, got: Any, want: Any) -> float:
        return float((got.float() - want.float()).abs().max())

    # -- Megatron ---------------------------------------------------------------------------------------------
    def softmax(self, family: str, mod: Any) -> None:
        torch = self.torch
        dtypes = (torch.float16, torch.bfloat16)
        tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
        sizes = (32, 128) if self.small else (256, 2048)
        # the kernels' own preconditions (Megatron's fused_softmax.py checks them before it calls a kernel): rows
        # per block (up to 8 here) divide the batches (b * heads) and the query length
        b, heads = (2, 4) if self.small else (2, 8)
        scale = 0.125
        for dtype in dtypes:
            dn = str(dtype).split(".")[1]
            for sk in sizes:
                sq = 16 if self.small and family != "megatron.scaled_upper_triang_masked_softmax" else sk
                self.run(family, f"fwd+bwd {dn} sq={sq} sk={sk}", tol[dtype],
                         lambda: self._softmax_once(family, mod, dtype, b, heads, sq, sk, scale))

    def _softmax_once(self, family: str, mod: Any, dtype: Any, b: int, heads: int, sq: int, sk: int,
                      scale: float) -> float:
        torch, dev = self.torch, self.device
        mask = None
        if family == "megatron.scaled_upper_triang_masked_softmax":
            x = torch.randn(b * heads, sq, sk, device=dev, dtype=dtype)
            y = mod.forward(x, scale)
            ref = softmax_ref(torch, x, scale, causal=True)
        elif family == "megatron.scaled_masked_softmax":
            x = torch.randn(b, heads, sq, sk, device=dev, dtype=dtype)
            mask = torch.rand(b, 1, sq, sk, device=dev) < 0.3
            mask &= ~torch.eye(sq, sk, dtype=torch.bool, device=dev)  # no row wholly masked
            y = mod.forward(x, mask, scale)
            ref = softmax_ref(torch, x, scale, mask=mask)
        else:
            x = torch.randn(b, heads, sq, sk, device=dev, dtype=dtype)
            y = mod.forward(x, scale)
            ref = softmax_ref(torch, x, scale)
        err_f = self.err(y, ref)
        if not hasattr(mod, "backward"):
            return err_f
        g = torch.randn_like(y)
        dx = mod.backward(g.clone(), y, scale)  # in place: the input grads are written over g
        return max(err_f, self.err(dx, softmax_bwd_ref(g, y, scale)))

    def layer_norm(self, family: str, mod: Any) -> None:
        torch = self.torch
        rows, n = (48, 256) if self.small else (4096, 1024)
        for dtype, tol in ((torch.float32, 1e-4), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
            dn = str(dtype).split(".")[1]
            self.run(family, f"fwd+bwd (input, weight, bias grads) {dn} {rows}x{n} (the error of each is "
                             "relative to its largest reference value)", max(tol, 1e-3),
                     functools.partial(self._layer_norm_once, mod, dtype, rows, n))

    def _layer_norm_once(self, mod: Any, dtype: Any, rows: int, n: int) -> float:
        torch, dev = self.torch, self.device
        x = torch.randn(rows, n, device=dev, dtype=dtype)
        w = torch.randn(n, device=dev, dtype=dtype)
        bias = torch.randn(n, device=dev, dtype=dtype)
        y, mean, invvar = mod.forward_affine(x, [n], w, bias, 1e-5)
        dy = torch.randn_like(y)
        try:  # Megatron's binding; apex's takes memory_efficient (False: the input is kept, as here) last
            dx, dw, db = mod.backward_affine(dy, mean, invvar, x, [n], w, bias, 1e-5)
        except TypeError:
            dx, dw, db = mod.backward_affine(dy, mean, invvar, x, [n], w, bias, 1e-5, False)
        xr, wr, br = (t.float().requires_grad_() for t in (x, w, bias))
        yr = torch.nn.functional.layer_norm(xr, [n], wr, br, 1e-5)
        yr.backward(dy.float())
        # relative to the largest value of each reference (outputs reach |15|; weight and bias grads sum all rows)
        return max(self.err(a, b) / max(1.0, float(b.abs().max()))
                   for a, b in ((y, yr), (dx, xr.grad), (dw, wr.grad), (db, br.grad)))

    # -- DeepSpeed --------------------------------------------------------------------------------------------
    def _params(self) -> list[Any]:
        shapes = [(64, 33), (257,), (8,)] if self.small else [(1024, 1024), (4097,), (333, 77), (8,)]
        return [self.torch.randn(s, device=self.device) for s in shapes]

    def fused_adam(self, family: str, mod: Any) -> None:
        for adam_w in (True, False):
            self.run(family, f"multi_tensor_adam ({'AdamW' if adam_w else 'Adam + L2'}) vs torch, fp32, 10 steps",
                     1e-5, functools.partial(self._adam_once, mod, adam_w))

    def _adam_once(self, mod: Any, adam_w: bool) -> float:
        torch = self.torch
        ps = self._params()
        mine = [p.clone() for p in ps]
        ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
        ref = [torch.nn.Parameter(p.clone()) for p in ps]
        lr, b1, b2, eps, wd = 1e-2, 0.9, 0.99, 1e-8, 0.1
        ref_opt = (torch.optim.AdamW if adam_w else torch.optim.Adam)(ref, lr=lr, betas=(b1, b2), eps=eps,
                                                                      weight_decay=wd, foreach=False)
        noop = torch.zeros(1, dtype=torch.int, device=self.device)
        for step in range(1, 11):
            grads = [torch.randn_like(p) for p in ps]
            # DeepSpeed's FusedAdam: tensor lists [grads, params, exp_avg, exp_avg_sq], mode 1 = AdamW
            mod.multi_tensor_adam(2048 * 32, noop, [grads, mine, ms, vs], lr, b1, b2, eps, step, int(adam_w), 1, wd)
            for p, g in zip(ref, grads):
                p.grad = g.clone()
            ref_opt.step()
        return max(self.err(a, b) for a, b in zip(mine, ref))

    def fused_lion(self, family: str, mod: Any) -> None:
        self.run(family, "multi_tensor_lion vs the Lion update in torch, fp32, 10 steps (elements whose update "
                         "direction is within rounding of 0 excluded)", 1e-5, lambda: self._lion_once(mod))

    def _lion_once(self, mod: Any) -> float:
        torch = self.torch
        ps = self._params()
        mine = [p.clone() for p in ps]
        ms = [torch.zeros_like(p) for p in ps]
        ref = [p.clone() for p in ps]
        moms = [torch.zeros_like(p) for p in ps]
        lr, b1, b2, wd = 1e-3, 0.9, 0.99, 0.1
        noop = torch.zeros(1, dtype=torch.int, device=self.device)
        near_zero = [torch.zeros_like(p, dtype=torch.bool) for p in ps]
        for step in range(1, 11):
            grads = [torch.randn_like(p) for p in ps]
            mod.multi_tensor_lion(2048 * 32, noop, [grads, mine, ms], lr, b1, b2, step, wd)
            for p, m, g, z in zip(ref, moms, grads, near_zero):
                c = b1 * m + (1 - b1) * g
                z |= c.abs() < 1e-6  # sign() of a c within rounding of 0 may differ between kernel and torch
                p.mul_(1 - lr * wd).add_(torch.sign(c), alpha=-lr)
                m.mul_(b2).add_(g, alpha=1 - b2)
        return max(float((a - b).abs().masked_fill(z, 0).max()) for a, b, z in zip(mine, ref, near_zero))

    def fused_lamb(self, family: str, mod: Any) -> None:
        self.run(family, "lamb vs DeepSpeed's LAMB update in torch (trust ratio clamped, bias correction in the step "
                         "size), fp32, 10 steps",
                 1e-5, lambda: self._lamb_once(mod))

    def _lamb_once(self, mod: Any) -> float:
        torch = self.torch
        worst = 0.0
        lr, b1, b2, eps, wd, max_coeff, min_coeff = 1e-2, 0.9, 0.999, 1e-8, 0.01, 10.0, 0.01
        for p0 in self._params():
            p = p0.clone()
            m, v = torch.zeros_like(p), torch.zeros_like(p)
            rp, rm, rv = p0.clone(), torch.zeros_like(p), torch.zeros_like(p)
            for step in range(1, 11):
                g = torch.randn_like(p)
                # DeepSpeed's FusedLamb: (p, p_out(fp16 copy, empty), exp_avg, exp_avg_sq, grad, lr, beta1, beta2,
                # max_coeff, min_coeff, eps, grad_scale, step, eps_mode (1: eps inside the sqrt is 0), bias_correction,
                # weight_decay)
                mod.lamb(p, torch.empty(0, device=self.device), m, v, g, lr, b1, b2, max_coeff, min_coeff, eps, 1.0,
                         step, 1, 1, wd)
                # DeepSpeed's LAMB: the moments are not bias-corrected themselves; the step size is
                # lr * sqrt(1 - b2^t) / (1 - b1^t), and the trust ratio |p| / |update| is clamped
                rm.mul_(b1).add_(g, alpha=1 - b1)
                rv.mul_(b2).addcmul_(g, g, value=1 - b2)
                update = rm / (rv.sqrt() + eps) + wd * rp
                w_norm, u_norm = float(rp.norm()), float(update.norm())
                ratio = min(max(w_norm / u_norm, min_coeff), max_coeff) if w_norm > 0 and u_norm > 0 else 1.0
                step_size = lr * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)
                rp.add_(update, alpha=-step_size * ratio)
            worst = max(worst, self.err(p, rp))
        return worst

    # -- apex -------------------------------------------------------------------------------------------------
    def _norm_grads(self) -> list[Any]:
        """Random tensors, and one per lane of a 64-lane wavefront with a single spike in that lane: a reduction that
        leaves out part of a wavefront misses some spike, whatever the seed."""
        spikes = [self.torch.zeros(512, device=self.device) for _ in range(0, 64, 4)]
        for lane, t in zip(range(0, 64, 4), spikes):
            t[lane] = 3.0 + lane / 64
        return self._params() + spikes

    def amp_c(self, family: str, mod: Any) -> None:
        for norm_type, what in ((0, "L-inf"), (2, "L2")):
            self.run(family, f"multi_tensor_novograd's per-tensor {what} grad norm (blended with beta2) vs torch, fp32 "
                             "(error relative to each norm)", 1e-5, functools.partial(self._novograd_norm, mod, norm_type))
        self.run(family, "multi_tensor_l2norm, whole list and per tensor, vs torch, fp32 (error relative to each "
                         "norm)", 1e-5, lambda: self._l2norm(mod))

    def _novograd_norm(self, mod: Any, norm_type: int) -> float:
        torch = self.torch
        grads = self._norm_grads()
        norms = torch.zeros(len(grads), device=self.device)
        noop = torch.zeros(1, dtype=torch.int, device=self.device)
        b2 = 0.75
        # (chunk size, noop flag, [grads, params, moments], grad norms, lr, beta1, beta2, eps, step, bias correction,
        # weight decay, grad averaging, moment mode, norm type): the norms are blended as b2 * old + (1 - b2) * new
        # (L-inf) or sqrt(b2 * old^2 + (1 - b2) * new^2) (L2)
        mod.multi_tensor_novograd(2048 * 32, noop, [grads, [torch.randn_like(g) for g in grads],
                                                    [torch.zeros_like(g) for g in grads]],
                                  norms, 1e-3, 0.9, b2, 1e-8, 1, 1, 0.0, 1, 0, norm_type)
        want = torch.stack([(1 - b2) * g.abs().max() if norm_type == 0 else ((1 - b2) * g.pow(2).sum()).sqrt()
                            for g in grads])
        return float(((norms - want).abs() / want.clamp(min=1.0)).max())

    def _l2norm(self, mod: Any) -> float:
        torch = self.torch
        grads = self._norm_grads()
        noop = torch.zeros(1, dtype=torch.int, device=self.device)
        total, per = mod.multi_tensor_l2norm(2048 * 32, noop, [grads], True)
        want = torch.stack([g.norm() for g in grads])
        whole = torch.cat([g.flatten() for g in grads]).norm()
        return max(float(((per.flatten() - want).abs() / want.clamp(min=1.0)).max()),
                   float((total.flatten()[0] - whole).abs() / whole.clamp(min=1.0)))

    def syncbn(self, family: str, mod: Any) -> None:
        shape = (4, 8, 6, 10) if self.small else (16, 64, 28, 28)
        self.run(family, f"welford_mean_var (NCHW) and welford_mean_var_c_last (NHWC) vs torch's mean and biased "
                         f"variance per channel, fp32 {'x'.join(map(str, shape))}", 1e-5,
                 lambda: self._welford(mod, shape))
        self.run(family, "batchnorm_forward vs torch, fp32", 1e-5, lambda: self._batchnorm(mod, shape))

    def _welford(self, mod: Any, shape: tuple[int, ...]) -> float:
        torch = self.torch
        x = torch.randn(shape, device=self.device) * 2 + 1
        mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
        m1, v1 = mod.welford_mean_var(x)
        m2, v2 = mod.welford_mean_var_c_last(x.permute(0, 2, 3, 1).contiguous())
        return max(self.err(m1, mean), self.err(v1, var), self.err(m2, mean), self.err(v2, var))

    def _batchnorm(self, mod: Any, shape: tuple[int, ...]) -> float:
        torch = self.torch
        x = torch.randn(shape, device=self.device)
        c = shape[1]
        mean, inv_std = torch.randn(c, device=self.device), torch.rand(c, device=self.device) + 0.5
        w, b = torch.randn(c, device=self.device), torch.randn(c, device=self.device)
        y = mod.batchnorm_forward(x, mean, inv_std, w, b)
        view = (1, c, 1, 1)
        return self.err(y, (x - mean.view(view)) * inv_std.view(view) * w.view(view) + b.view(view))


def softmax_ref(torch: Any, x: Any, scale: float, mask: Any = None, causal: bool = False) -> Any:
    s = x.float() * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if mask is not None:
        s = s.masked_fill(mask, -10000.0)
    return torch.softmax(s, dim=-1)


def softmax_bwd_ref(g: Any, y: Any, scale: float) -> Any:
    g, y = g.float(), y.float()
    return scale * y * (g - (g * y).sum(-1, keepdim=True))


RUNNERS: dict[str, str] = {
    "megatron.scaled_upper_triang_masked_softmax": "softmax", "megatron.scaled_masked_softmax": "softmax",
    "megatron.scaled_softmax": "softmax", "megatron.layer_norm": "layer_norm", "deepspeed.fused_adam": "fused_adam",
    "deepspeed.fused_lamb": "fused_lamb", "deepspeed.fused_lion": "fused_lion", "apex.amp_C": "amp_c",
    "apex.fused_layer_norm": "layer_norm", "apex.syncbn": "syncbn",
}


def run_checks(device: str, wave: int, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Every family whose module is found (``only``: those families), in a fixed order, seeded."""
    import torch

    checks = Checks(device, wave)
    for family, module in FAMILIES.items():
        if only and family not in only:
            continue
        torch.manual_seed(0)
        try:
            mod = load(module)
        except ImportError as exc:
            checks.rows.append({"kernel": family, "check": f"import {module}", "wave": wave, "max_abs_err": None,
                                "tolerance": None, "ok": False, "error": str(exc)[:2000]})
            continue
        if mod is not None:
            getattr(checks, RUNNERS[family])(family, mod)
    return checks.rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--wave", type=int, required=True)
    ap.add_argument("--only", action="append", default=[], choices=sorted(FAMILIES))
    ap.add_argument("--out", help="write the JSON list here (default: stdout)")
    args = ap.parse_args(argv)
    text = json.dumps(run_checks(args.device, args.wave, args.only or None))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
