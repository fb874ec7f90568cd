"""Multi-layer perceptron with the initialisation NVIDIA's DLRM uses."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ctrkit import native

_local = threading.local()  # the calling thread's dropout generator (dropout_generator)


@contextmanager
def dropout_generator(generator: torch.Generator) -> Iterator[None]:
    """CPU dropout masks drawn in this thread from ``generator`` instead of torch's global one (a step split over
    threads gives each slice its own, so the masks do not depend on which thread draws first)."""
    previous = getattr(_local, "generator", None)
    _local.generator = generator
    try:
        yield
    finally:
        _local.generator = previous


NARROW_INPUT = 64  # inputs at most this wide take the weight's gradient as (x^T g)^T (see _LinearReLUFn)


class _CpuDropout(torch.autograd.Function):
    """Dropout's training forward and backward for CPU tensors. The mask is drawn as 15 random bits per
    element (two elements per int32 from ``random_``, whose values lie in [0, 2^31)) against a threshold,
    so each element is kept with probability 1 - p to within 2^-15: on the CPU this costs about half of
    ``F.dropout``'s per-element Bernoulli draws. The mask is kept as ones and zeros in the input's dtype and
    applied by a product, then the scale: ``where`` with a scalar is slower than the product on the CPU. Kept
    values come out as ``where``'s did (x * 1, then the scale); dropped ones are zeros (-0.0 for a negative
    value)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        n = x.numel()
        generator = getattr(_local, "generator", None)
        bits = torch.empty((n + 1) // 2, dtype=torch.int32).random_(generator=generator).view(torch.int16)[:n]
        keep = (bits.bitwise_and_(0x7FFF) >= round(p * 2**15)).view(x.shape).to(x.dtype)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return (x * keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None


class Dropout(nn.Module):
    """``nn.Dropout`` (inverted dropout: kept values scaled by 1 / (1 - p), identity in evaluation) with
    a faster training path on the CPU (``_CpuDropout``); other devices use ``F.dropout``."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return _CpuDropout.apply(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class _LinearReLUFn(torch.autograd.Function):
    """``relu(x @ weight.T + bias)`` for float32 CPU training, with the bias and ReLU in ctrkit/native/mlp.c: the
    product is written without the bias (``mm`` rather than ``addmm``, which first copies the bias into its
    output), one pass adds the bias and applies ReLU in place, and backward's one pass masks the gradient and sums
    it for the bias; ATen's layers take four passes over the output for this. The same values as ``F.linear`` then
    ``F.relu`` to float rounding (tests). For a narrow input (the bottom MLP's 13 numerical features) the
    weight's gradient is computed as ``(x^T g)^T``: the (B, in) x (B, N) product in that order is the faster
    one for so few inputs."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.mm(x, weight.t())
        native.library().ctrkit_bias_relu_f32(y.data_ptr(), bias.contiguous().data_ptr(), *y.shape)
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    @once_differentiable  # the C pass is not differentiable again
    def backward(ctx, grad: torch.Tensor):
        x, weight, y = ctx.saved_tensors
        grad = grad.contiguous()
        masked = torch.empty_like(y)
        grad_bias = torch.empty(y.shape[1], dtype=y.dtype)
        native.library().ctrkit_relu_backward_bias_f32(
            grad.data_ptr(), y.data_ptr(), masked.data_ptr(), grad_bias.data_ptr(), *y.shape
        )
        grad_x = masked @ weight if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (x.t() @ masked).t().contiguous() if x.shape[1] <= NARROW_INPUT else masked.t() @ x
        return grad_x, grad_w, grad_bias if ctx.needs_input_grad[2] else None


class _LinearChainFn(torch.autograd.Function):
    """A whole MLP without dropout for CPU training, in one autograd node: each layer's product, bias and ReLU (the
    last layer without ReLU where ``relu_last`` is False), and in backward each layer's masked gradient and bias
    gradient in one C pass. Backward owns the gradients it computes between layers, so each masked gradient is
    written over the gradient it masks (no buffer of its own, which the write would first read), and the autograd
    engine visits one node, not three or four per layer.

    float32 (``bf16`` False): ``_LinearReLUFn``'s operations in the same order, so the same values (tests).
    ``bf16`` (training under bfloat16 autocast): what autocast runs for the layers (weights, biases and input cast to
    bfloat16, ``addmm``, ``relu_``), ATen's values; backward's products in bfloat16 as autocast's, the masked
    gradient in one pass (``threshold_backward``'s values) and the bias's gradient summed in float by chunks of rows,
    the chunks in double, and rounded to bfloat16 (ATen sums in float in its own order: the last bit may differ);
    the weights' gradients come back in float32, as autocast's casts give them."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, relu_last: bool, bf16: bool, *params: torch.Tensor) -> torch.Tensor:
        lib = native.library()
        layers = len(params) // 2
        ctx.relu_last, ctx.bf16, ctx.input_dtype = relu_last, bf16, x.dtype
        if bf16:
            with torch.autocast("cpu", enabled=False):
                acts = [x.to(torch.bfloat16).contiguous()]
                weights = [w.to(torch.bfloat16) for w in params[0::2]]
                for i in range(layers):
                    acts.append(torch.addmm(params[2 * i + 1].to(torch.bfloat16), acts[-1], weights[i].t()))
                    if i < layers - 1 or relu_last:
                        acts[-1].relu_()
            ctx.save_for_backward(*acts, *weights)
            return acts[-1]
        acts = [x.contiguous()]
        for i in range(layers):
            weight, bias = params[2 * i], params[2 * i + 1]
            if i < layers - 1 or relu_last:
                y = torch.mm(acts[-1], weight.t())
                lib.ctrkit_bias_relu_f32(y.data_ptr(), bias.contiguous().data_ptr(), *y.shape)
            else:
                y = torch.addmm(bias, acts[-1], weight.t())
            acts.append(y)
        ctx.save_for_backward(*acts, *params[0::2])
        return acts[-1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        lib = native.library()
        saved = ctx.saved_tensors
        layers = (len(saved) - 1) // 2
        acts, weights = saved[: layers + 1], saved[layers + 1 :]
        needs = ctx.needs_input_grad
        grads: list[torch.Tensor | None] = [None] * (2 * layers)
        dtype = torch.bfloat16 if ctx.bf16 else torch.float32
        g = grad.to(dtype).contiguous()
        owned = g.data_ptr() != grad.data_ptr()  # a copy made here may be overwritten; the caller's gradient not
        with torch.autocast("cpu", enabled=False):
            for i in reversed(range(layers)):
                x, y, weight = acts[i], acts[i + 1], weights[i]
                if i < layers - 1 or ctx.relu_last:
                    grad_bias = torch.empty(y.shape[1], dtype=torch.float32)
                    out = None if owned else torch.empty_like(y)
                    kernel = lib.ctrkit_relu_backward_bias_bf16 if ctx.bf16 else lib.ctrkit_relu_backward_bias_f32
                    out_pointer = None if out is None else out.data_ptr()  # None: over g
                    kernel(g.data_ptr(), y.data_ptr(), out_pointer, grad_bias.data_ptr(), *y.shape)
                    g = g if out is None else out
                else:
                    grad_bias = g.sum(0).float()
                if needs[3 + 2 * i]:
                    if ctx.bf16:  # as autocast's addmm backward gives a column-major mat2's gradient, then float32
                        grads[2 * i] = (g.t() @ x).float()
                    else:
                        wide = x.shape[1] > NARROW_INPUT
                        grads[2 * i] = g.t() @ x if wide else (x.t() @ g).t().contiguous()
                if needs[4 + 2 * i]:
                    grads[2 * i + 1] = grad_bias
                if i > 0 or needs[0]:
                    g, owned = g @ weight, True
        return (g.to(ctx.input_dtype) if needs[0] else None), None, None, *grads


@torch.no_grad()
def normal_init(weight: torch.Tensor, std: float) -> None:
    """Draws ``weight`` N(0, std) in place; a weight on the meta device (the plan's model, which has no values) is
    left as it is: torch's meta draw is written in Python and imports torch._dynamo, a second of every start."""
    if weight.device.type != "meta":
        weight.normal_(0.0, std)


class MLP(nn.Sequential):
    """Linear layers with ReLU between them.

    Weights are drawn from N(0, sqrt(2 / (fan_in + fan_out))) and biases from N(0, sqrt(1 / fan_out)),
    as in the reference DLRM.

    Args:
        in_features: width of the input.
        sizes: output width of each layer.
        relu_last: apply ReLU after the last layer too (bottom MLP) or not (a top MLP ending in a logit).
        dropout: dropout probability after each ReLU (0: none).

    Shapes: (B, in_features) -> (B, sizes[-1]).
    """

    def __init__(self, in_features: int, sizes: Sequence[int], relu_last: bool = True, dropout: float = 0.0):
        layers: list[nn.Module] = []
        width = in_features
        for i, out in enumerate(sizes):
            linear = nn.Linear(width, out)
            normal_init(linear.weight, math.sqrt(2.0 / (width + out)))
            normal_init(linear.bias, math.sqrt(1.0 / out))
            layers.append(linear)
            if relu_last or i < len(sizes) - 1:
                layers.append(nn.ReLU(inplace=True))
                if dropout > 0:
                    layers.append(Dropout(dropout))
            width = out
        super().__init__(*layers)
        self.out_features = width
        self.use_native = True  # float32 CPU training by ctrkit/native's kernels where built (False: ATen's ops)
        self.use_chain = True  # ... without dropout, as one autograd node (_LinearChainFn; False: one per layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = self._native_kind(x)
        if kind is None:  # inference, export, compile, other devices or dtypes: the layers' ops
            return super().forward(x)
        layers = list(self)
        if self.use_chain and not any(isinstance(m, Dropout) for m in layers):
            linears = [m for m in layers if isinstance(m, nn.Linear)]
            relu_last = isinstance(layers[-1], nn.ReLU)
            params = [t for m in linears for t in (m.weight, m.bias)]
            return _LinearChainFn.apply(x, relu_last, kind == "bf16", *params)
        if kind == "bf16":  # with dropout under autocast: the layers' ops
            return super().forward(x)
        i = 0
        while i < len(layers):
            layer = layers[i]
            if isinstance(layer, nn.Linear) and i + 1 < len(layers) and isinstance(layers[i + 1], nn.ReLU):
                x = _LinearReLUFn.apply(x, layer.weight, layer.bias)
                i += 2
            else:
                x = layer(x)
                i += 1
        return x

    def _native_kind(self, x: torch.Tensor) -> str | None:
        """ "f32" (float32 training), "bf16" (training under the CPU's bfloat16 autocast) where ctrkit/native's
        kernels take this MLP's training forward, else None."""
        if not (self.use_native and torch.is_grad_enabled() and x.device.type == "cpu" and x.dim() == 2):
            return None
        if torch.compiler.is_compiling():
            return None
        weights = [t for m in self if isinstance(m, nn.Linear) for t in (m.weight, m.bias)]
        if any(w is None or w.dtype != torch.float32 or w.device.type != "cpu" for w in weights):
            return None
        if native.library() is None:
            return None
        if torch.is_autocast_enabled("cpu"):
            bf16 = torch.get_autocast_dtype("cpu") == torch.bfloat16
            return "bf16" if bf16 and x.dtype in (torch.float32, torch.bfloat16) else None
        return "f32" if x.dtype == torch.float32 else None
