"""One MoE layer's NVFP4 expert weights as a checked bundle, built once when the weights are loaded.

    E = local experts, H = hidden size, I = intermediate size per expert

The weights never change after loading, so their checks (dtypes, shapes, contiguity, one device) run
once, in ``Nvfp4MoeWeights.build``; a call of the op checks only what changes per call (the hidden
states and the routing: ``routing.validate_call``). The SGLang plugin builds the bundle in
``process_weights_after_loading`` and keeps it on the layer; ``moe.nvfp4_fused_moe`` with loose tensors
builds one per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from sglang_glm5 import hardware, nvfp4

W13_ORDERS = ("gate_up", "up_gate")


def check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], shape: tuple[int | None, ...]) -> None:
    """TypeError / ValueError naming ``name``, what was expected and what came; None in a shape is any size."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {t.dtype}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape, strict=True)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")


def per_expert_scale(scale: torch.Tensor | float, num_experts: int, name: str, device: torch.device) -> torch.Tensor:
    """A scalar or [E] scale -> [E] fp32, contiguous, on ``device``."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=device)
    if s.dim() == 0:
        return s.expand(num_experts).contiguous()
    if s.dim() == 1 and s.shape[0] == num_experts:
        return s.contiguous()
    raise ValueError(f"{name}: expected a scalar or shape [{num_experts}], got {list(s.shape)}")


def _layout_fits(layout: str, hidden: int, inter: int) -> bool:
    """Whether both GEMMs' K (H = ``hidden``, I = ``inter``) are whole periods of ``layout``'s activation K order
    (``nvfp4.activation_period``: 64 for kernel_wgmma)."""
    period = nvfp4.activation_period(layout)
    return hidden % period == 0 and inter % period == 0


def kernel_layout(arch: int, hidden: int, inter: int) -> str:
    """The W4A16 kernels' weight layout for a GPU of ``arch`` and a layer of H = ``hidden``, I = ``inter``:
    "kernel_wgmma" where wgmma takes the decoded weights from registers (``hardware.wgmma_from_registers``)
    and H, I are multiples of 64, else "kernel" (``nvfp4.LAYOUTS``)."""
    if hardware.wgmma_from_registers(arch) and _layout_fits("kernel_wgmma", hidden, inter):
        return "kernel_wgmma"
    return "kernel"


def _check_layout_shape(layout: str, hidden: int, inter: int) -> None:
    """ValueError unless H = ``hidden`` and I = ``inter`` suit ``layout`` (kernel_wgmma: multiples of 64)."""
    if layout == "kernel_wgmma" and not _layout_fits(layout, hidden, inter):
        period = nvfp4.activation_period(layout)
        raise ValueError(f"layout {layout}: H and I must be multiples of {period}, got H={hidden}, I={inter}")


@dataclass(frozen=True, eq=False)
class Nvfp4MoeWeights:
    """The six NVFP4 tensors of a layer's local experts, their w13 row order and, for the W4A4 path, the
    activation global scales. Build it with ``build`` (which checks); fields are read-only."""

    w13: torch.Tensor  # [E, 2I, H/2] uint8, two e2m1 per byte (checkpoint layout: element 2i in the low nibble)
    w13_scale: torch.Tensor  # [E, 2I, H/16] e4m3, linear layout (kernel layout: scale codes)
    w13_scale_2: torch.Tensor  # [E] or [E, 2] fp32 (gate, up), contiguous
    w2: torch.Tensor  # [E, H, I/2] uint8
    w2_scale: torch.Tensor  # [E, H, I/16] e4m3
    w2_scale_2: torch.Tensor  # [E] fp32, contiguous
    w13_order: str  # "gate_up": w13 rows are [gate; up]; "up_gate": [up; gate]
    w13_input_scale: torch.Tensor | float | None  # scalar, [E] or [E, 2]: the checkpoint's (W4A4 only)
    w2_input_scale: torch.Tensor | float | None  # scalar or [E]
    layout: str = "checkpoint"  # of the codes and scales (nvfp4.LAYOUTS), set by ``converted``

    @classmethod
    def build(
        cls,
        w13: torch.Tensor,
        w13_scale: torch.Tensor,
        w13_scale_2: torch.Tensor,
        w2: torch.Tensor,
        w2_scale: torch.Tensor,
        w2_scale_2: torch.Tensor,
        *,
        w13_order: str = "gate_up",
        w13_input_scale: torch.Tensor | float | None = None,
        w2_input_scale: torch.Tensor | float | None = None,
        layout: str = "checkpoint",
    ) -> Nvfp4MoeWeights:
        """Check the tensors (TypeError / ValueError naming the argument) and bundle them.

        w13_input_scale: scalar, [E] or [E, 2] fp32 (its max is W4A4's one activation global scale);
        w2_input_scale: scalar or [E]. Both or neither: they are what the W4A4 path quantizes with.
        layout: that of the codes and scales given (``nvfp4.LAYOUTS``).
        """
        check_tensor("w13", w13, (torch.uint8,), (None, None, None))
        num_experts, two_i, half_h = w13.shape
        hidden = 2 * half_h
        if hidden <= 0 or hidden % 32:
            raise ValueError(f"w13: dim 2 must be H/2 with H a positive multiple of 32, got {half_h}")
        if two_i <= 0 or two_i % 2 or (two_i // 2) % 32:
            raise ValueError(f"w13: dim 1 must be 2*I with I a positive multiple of 32, got {two_i}")
        inter = two_i // 2
        check_tensor("w13_scale", w13_scale, (torch.float8_e4m3fn,), (num_experts, two_i, hidden // 16))
        if not isinstance(w13_scale_2, torch.Tensor) or w13_scale_2.dim() not in (1, 2):
            got = list(w13_scale_2.shape) if isinstance(w13_scale_2, torch.Tensor) else type(w13_scale_2).__name__
            raise ValueError(f"w13_scale_2: expected shape [{num_experts}] or [{num_experts}, 2], got {got}")
        gate_up = (2,) if w13_scale_2.dim() == 2 else ()
        check_tensor("w13_scale_2", w13_scale_2, (torch.float32,), (num_experts, *gate_up))
        check_tensor("w2", w2, (torch.uint8,), (num_experts, hidden, inter // 2))
        check_tensor("w2_scale", w2_scale, (torch.float8_e4m3fn,), (num_experts, hidden, inter // 16))
        check_tensor("w2_scale_2", w2_scale_2, (torch.float32,), (num_experts,))
        for name, t in (("w13", w13), ("w13_scale", w13_scale), ("w2", w2), ("w2_scale", w2_scale)):
            if not t.is_contiguous():
                raise ValueError(f"{name}: must be contiguous (strides {t.stride()} for shape {list(t.shape)})")
        if layout not in nvfp4.LAYOUTS:
            raise ValueError(f"layout: expected one of {nvfp4.LAYOUTS}, got {layout!r}")
        _check_layout_shape(layout, hidden, inter)
        if w13_order not in W13_ORDERS:
            raise ValueError(f"w13_order: expected one of {W13_ORDERS}, got {w13_order!r}")
        device = w13.device
        for name, t in (("w13_scale", w13_scale), ("w13_scale_2", w13_scale_2), ("w2", w2), ("w2_scale", w2_scale),
                        ("w2_scale_2", w2_scale_2)):  # fmt: skip
            if t.device != device:
                raise ValueError(f"{name}: expected device {device} (that of w13), got {t.device}")
        if (w13_input_scale is None) != (w2_input_scale is None):
            raise ValueError("w13_input_scale, w2_input_scale: expected both (the W4A4 path needs them) or neither")
        w2_in = torch.as_tensor(w2_input_scale) if isinstance(w2_input_scale, torch.Tensor) else None
        if w2_in is not None and not (w2_in.dim() == 0 or tuple(w2_in.shape) == (num_experts,)):
            raise ValueError(f"w2_input_scale: expected a scalar or shape [{num_experts}], got {list(w2_in.shape)}")
        return cls(
            w13, w13_scale, w13_scale_2.contiguous(), w2, w2_scale, w2_scale_2.contiguous(), w13_order,
            w13_input_scale, w2_input_scale, layout,
        )  # fmt: skip

    def converted(self, layout: str, *, in_place: bool = False) -> Nvfp4MoeWeights:
        """The same weights with codes and scales in ``layout`` (``nvfp4.LAYOUTS``; the same values).

        ``in_place`` re-encodes the tensors' own storage, one expert at a time, so a layer never holds a
        second copy of its weights (what the SGLang plugin does at load time; afterwards the tensors are
        only good for this bundle); otherwise the result has new tensors and this bundle is untouched.
        ValueError on a NaN block scale (checkpoint -> kernel); a negative one becomes its magnitude."""
        if layout not in nvfp4.LAYOUTS:
            raise ValueError(f"layout: expected one of {nvfp4.LAYOUTS}, got {layout!r}")
        if layout == self.layout:
            return self
        # before any tensor changes: an in-place conversion is all or nothing
        _check_layout_shape(layout, self.hidden, self.inter)
        if self.layout == "checkpoint":
            nvfp4.check_block_scales(self.w13_scale)
            nvfp4.check_block_scales(self.w2_scale)

        def convert(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.layout != "checkpoint":
                packed, scale = nvfp4.from_kernel_layout(packed, scale, self.layout)
            if layout != "checkpoint":
                packed, scale = nvfp4.to_kernel_layout(packed, scale, layout)
            return packed, scale

        tensors = []
        for packed, scale in ((self.w13, self.w13_scale), (self.w2, self.w2_scale)):
            if not in_place:
                tensors += convert(packed, scale)
                continue
            for e in range(packed.shape[0]):
                new_packed, new_scale = convert(packed[e], scale[e])
                packed[e].copy_(new_packed)
                scale[e].view(torch.uint8).copy_(new_scale.view(torch.uint8))
            tensors += (packed, scale)
        w13, w13_scale, w2, w2_scale = tensors
        return Nvfp4MoeWeights(
            w13, w13_scale, self.w13_scale_2, w2, w2_scale, self.w2_scale_2, self.w13_order, self.w13_input_scale,
            self.w2_input_scale, layout,
        )  # fmt: skip

    def for_device(self, *, in_place: bool = False, w4a4: bool = False) -> Nvfp4MoeWeights:
        """The bundle the SGLang plugin keeps: ``converted`` to a kernel layout on a CUDA GPU, where the
        W4A16 kernels decode it with fewer instructions (``nvfp4.to_kernel_layout``; ``kernel_layout``).
        ``w4a4``: the layer may run the W4A4 kernels (``w4a4_select.may_take_w4a4``), which read the
        checkpoint's codes and scales: it keeps them. Off a CUDA GPU (the interpreter) nothing is converted."""
        arch = hardware.device_arch(self.device)
        keep = w4a4 or arch is None
        return self.converted("checkpoint" if keep else kernel_layout(arch, self.hidden, self.inter),
                              in_place=in_place)  # fmt: skip

    # The W4A4 path's activation global scales, computed on its first use (a call that never takes W4A4
    # pays nothing for them).

    @cached_property
    def a1(self) -> torch.Tensor | None:
        """[1] fp32: the max of the w13 input scales, W4A4's one activation scale for x; None without them."""
        if self.w13_input_scale is None:
            return None
        return torch.as_tensor(self.w13_input_scale, dtype=torch.float32, device=self.device).max().reshape(1)

    @cached_property
    def a2(self) -> torch.Tensor | None:
        """[E] fp32: the w2 input scales per local expert; None without them."""
        if self.w2_input_scale is None:
            return None
        return per_expert_scale(self.w2_input_scale, self.num_experts, "w2_input_scale", self.device)

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.shape[2] * 2

    @property
    def inter(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def device(self) -> torch.device:
        return self.w13.device

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, H, I)."""
        return self.num_experts, self.hidden, self.inter

    @property
    def gate_up_rows(self) -> tuple[int, int]:
        """(first gate row, first up row) of w13."""
        return (0, self.inter) if self.w13_order == "gate_up" else (self.inter, 0)

    @property
    def has_input_scales(self) -> bool:
        return self.w13_input_scale is not None

    def args(self) -> tuple[torch.Tensor, ...]:
        """The six tensors in the order of the loose-tensor signatures (``nvfp4_fused_moe``, the reference)."""
        return (self.w13, self.w13_scale, self.w13_scale_2, self.w2, self.w2_scale, self.w2_scale_2)
