"""LinearAttnBackend: the recurrences of hybrid models' state layers, on a batch of requests.

Every call takes the new tokens of a batch of requests concatenated (`seq_lens` new tokens per
request, a decode step being 1 each) and the state pool's tensor for one layer, indexed by `rows`
(each request's state slot). It reads the states at `rows`, advances them over the request's new
tokens and writes them back in place: the state after a call is the state after the last token.

Layouts (the state pool allocates them; cache/state_pool.py):
  conv_state  [slots, K - 1, C]   the last K - 1 inputs of the conv, oldest first (time-major, so
                                  a token's row of C channels is contiguous, as the inputs are)
  ssm_state   [slots, H, Dk, Dv]  gated delta rule: value head h's state, o = S^T q
              [slots, H, P, N]    Mamba-2: head h's state over head_dim P x state size N

Backends: torch (this package, any device, the fallback), native (CPU: AVX2 / AVX-512 chosen at
run time) and triton (CUDA; CPU tensors under Triton's interpreter for tests). Registered in
LINEAR_ATTN_BACKEND_REGISTRY in auto's order of preference, with the device types auto picks them
on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixlm.model.layers.linear_attn.kda_rule import kda_batch
from radixlm.model.layers.linear_attn.selective_scan import selective_scan_batch
from radixlm.registry import Registry


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """HF's (and FLA's) l2norm over the last dimension, in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class LinearAttnBackend(ABC):
    name: str = ""

    @abstractmethod
    def causal_conv1d(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        conv_state: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: list[int],
        activation: str | None,
    ) -> torch.Tensor:
        """Depthwise causal conv over each request's tokens, continuing from its conv state.
        x [T, C]; weight [C, K]; bias [C] or None; conv_state [slots, K - 1, C]; rows int64 [bs];
        activation "silu" or None. -> y [T, C] in x's dtype; conv_state[rows] becomes the last
        K - 1 inputs of each request (its older inputs where it has fewer new ones)."""

    @abstractmethod
    def gated_delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        ssm_state: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: list[int],
    ) -> torch.Tensor:
        """The gated delta rule, per token t of a request and value head h (key head
        h // (Hv // Hk)):
            S = exp(g[t, h]) * S
            S = S + k_t (beta[t, h] * (v_t - S^T k_t))^T
            o_t = S^T q_t
        q, k [T, Hk, Dk] (already l2-normalized, q already scaled); v [T, Hv, Dv]; g, beta [T, Hv]
        float32 (g <= 0: log decay); ssm_state [slots, Hv, Dk, Dv]. -> o [T, Hv, Dv] in v's
        dtype. Computed in float32 whatever the inputs' dtype."""

    def gated_delta_rule_gated(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        a_log: torch.Tensor,
        dt_bias: torch.Tensor,
        ssm_state: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: list[int],
        tiled: bool,
    ) -> torch.Tensor:
        """gated_delta_rule from Gated DeltaNet's raw inputs (a backend may fuse these steps):
            beta = sigmoid(b), g = -exp(a_log) * softplus(a + dt_bias)   (float32)
            q = l2norm(q) * Dk^-0.5, k = l2norm(k)   (float32; l2norm: x * rsqrt(sum(x^2) + 1e-6))
        q, k [T, Hk, Dk] (any float dtype and strides); v [T, Hv, Dv]; a, b [T, Hv]; a_log,
        dt_bias [Hv]. Value head h reads key head h % Hk where `tiled` (llama.cpp's order), else
        h // (Hv // Hk). -> o [T, Hv, Dv] in v's dtype."""
        beta = b.float().sigmoid()
        g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
        q = _l2norm(q) * q.shape[-1] ** -0.5
        k = _l2norm(k)
        repeat = v.shape[1] // q.shape[1]
        if tiled and repeat > 1:  # [T, Hk, D] -> [T, Hv, D], head h = key head h % Hk
            q, k = q.repeat(1, repeat, 1), k.repeat(1, repeat, 1)
        return self.gated_delta_rule(q, k, v, g, beta, ssm_state, rows, seq_lens)

    def kimi_delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        ssm_state: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: list[int],
    ) -> torch.Tensor:
        """Kimi Delta Attention (Kimi-Linear): gated_delta_rule with a log decay per key channel,
        per token t and head h:
            S = diag(exp(g[t, h])) S
            S = S + k_t (beta[t, h] * (v_t - S^T k_t))^T
            o_t = S^T q_t
        q, k [T, H, Dk] (l2-normalized, q scaled); v [T, H, Dv]; g [T, H, Dk] float32 (<= 0);
        beta [T, H]; ssm_state [slots, H, Dk, Dv]. -> o [T, H, Dv] in v's dtype, computed in
        float32. This default is torch's (kda_rule.py); native and triton run their kernels."""
        return kda_batch(q, k, v, g, beta, ssm_state, rows, seq_lens)

    def selective_scan(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        ssm_state: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: list[int],
    ) -> torch.Tensor:
        """Mamba-1's selective scan, per token t and channel d:
            S[d] = exp(dt[t, d] * a[d]) * S[d] + dt[t, d] * x[t, d] * b_t
            y[t, d] = S[d] . c_t
        x [T, D]; dt [T, D] float32 (after softplus); a [D, N] float32 (< 0); b, c [T, N];
        ssm_state [slots, D, N]. -> y [T, D] in x's dtype (without the D skip and the gate),
        computed in float32. This default is torch's (selective_scan.py) on every backend."""
        return selective_scan_batch(x, dt, a, b, c, ssm_state, rows, seq_lens)

    def gated_rmsnorm(
        self, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """Gated DeltaNet's output norm (HF's Qwen3_5RMSNormGated): each row of x [..., D]
        RMS-normalized (float32 statistics), times weight [D], times silu(z) (z: x's shape).
        -> x's shape and dtype."""
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return (weight * x32.to(dtype) * F.silu(z.float())).to(dtype)

    @abstractmethod
    def ssd(
        self,
        x: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        ssm_state: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: list[int],
    ) -> torch.Tensor:
        """Mamba-2's selective state update, per token t and head h (group h // (H // G)):
            S = exp(dt[t, h] * a[h]) * S + dt[t, h] * x_t b_t^T
            y_t = S c_t
        x [T, H, P]; dt [T, H] float32 (after softplus and clamping); a [H] float32 (< 0);
        b, c [T, G, N]; ssm_state [slots, H, P, N]. -> y [T, H, P] in x's dtype (without the D
        skip: the layer adds D * x)."""


@dataclass(frozen=True)
class LinearAttnBackendInfo:
    # None, or why the backend cannot run on this device (kernels missing, no GPU, ...).
    unavailable: Callable[[torch.device], str | None]
    auto_devices: tuple[str, ...] | None = None  # device types auto picks it on (None: any)


LINEAR_ATTN_BACKEND_REGISTRY = Registry[Callable[[], LinearAttnBackend], LinearAttnBackendInfo](
    "linear attention backend"
)


def _native_unavailable(device: torch.device) -> str | None:
    if device.type != "cpu":
        return f"the native kernels run on CPU, not {device.type}"
    from radixlm.kernels import build

    if not build.load():
        return f"native kernels unavailable: {build.unavailable_reason()}"
    return None


def _triton_unavailable(device: torch.device) -> str | None:
    from radixlm.kernels.triton_ops import unavailable_reason

    return unavailable_reason(device)


# Registered in auto's order of preference (each backend's module registers itself by a dotted
# path here, so nothing is imported until one is chosen).
LINEAR_ATTN_BACKEND_REGISTRY.register(
    "native",
    "radixlm.model.layers.linear_attn.native_backend:NativeLinearAttnBackend",
    LinearAttnBackendInfo(_native_unavailable, auto_devices=("cpu",)),
)
LINEAR_ATTN_BACKEND_REGISTRY.register(
    "triton",
    "radixlm.model.layers.linear_attn.triton_backend:TritonLinearAttnBackend",
    LinearAttnBackendInfo(_triton_unavailable, auto_devices=("cuda",)),
)
LINEAR_ATTN_BACKEND_REGISTRY.register(
    "torch",
    "radixlm.model.layers.linear_attn.torch_backend:TorchLinearAttnBackend",
    LinearAttnBackendInfo(lambda device: None),
)


def create_linear_attn_backend(name: str, device: torch.device) -> LinearAttnBackend:
    """--linear-attn-backend: a name, or auto (the first available whose auto_devices include
    the device). A named backend that cannot run here is a ValueError saying why."""
    if name != "auto":
        reason = LINEAR_ATTN_BACKEND_REGISTRY.meta(name).unavailable(device)
        if reason:
            raise ValueError(f"--linear-attn-backend {name}: {reason}")
        return LINEAR_ATTN_BACKEND_REGISTRY.get(name)()
    for candidate in LINEAR_ATTN_BACKEND_REGISTRY.names():
        info = LINEAR_ATTN_BACKEND_REGISTRY.meta(candidate)
        if info.auto_devices is not None and device.type not in info.auto_devices:
            continue
        if info.unavailable(device) is None:
            return LINEAR_ATTN_BACKEND_REGISTRY.get(candidate)()
    raise AssertionError("the torch backend runs anywhere")
