"""A training state (nested dicts, lists and tuples of tensors and plain values) as a skeleton
and a list of tensors, and back: the snapshot keeps the tensors' bytes in one flat buffer and
the skeleton (where each tensor sat, and every plain value) beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

TENSOR_TAG = "__kubeddp_tensor__"  # the placeholder a tensor leaves in the skeleton
ALIGN = 64  # every tensor starts on a cache line of the buffer


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor's bytes sit in the flat buffer, and what they are."""

    offset: int
    nbytes: int
    dtype: str  # "float32", "bfloat16", ...
    shape: tuple[int, ...]


def _rebuilt(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value`'s dicts, lists and tuples rebuilt around what `leaf` makes of each item; `leaf`
    sees every item first and returns it unchanged to have it walked (or kept)."""
    made = leaf(value)
    if made is not value:
        return made
    if isinstance(value, dict):
        return {key: _rebuilt(item, leaf) for key, item in value.items()}
    if isinstance(value, list):
        return [_rebuilt(item, leaf) for item in value]
    if isinstance(value, tuple):
        return tuple(_rebuilt(item, leaf) for item in value)
    return value


def split(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """The skeleton of `state` (each tensor replaced by (TENSOR_TAG, index)) and its tensors,
    in the order they were met."""
    tensors: list[torch.Tensor] = []

    def placeholder(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            tensors.append(value.detach())
            return (TENSOR_TAG, len(tensors) - 1)
        return value

    return _rebuilt(state, placeholder), tensors


def join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The state `split` took apart, with `tensors` where the placeholders are."""

    def tensor(value: Any) -> Any:
        if isinstance(value, tuple) and len(value) == 2 and value[0] == TENSOR_TAG:
            return tensors[value[1]]
        return value

    return _rebuilt(skeleton, tensor)


def layout(tensors: list[torch.Tensor]) -> tuple[list[TensorSlot], int]:
    """Each tensor's place in the flat buffer, and the buffer's size in bytes."""
    slots, offset = [], 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        dtype = str(tensor.dtype).removeprefix("torch.")
        slots.append(TensorSlot(offset, nbytes, dtype, tuple(tensor.shape)))
        offset += -(-nbytes // ALIGN) * ALIGN
    return slots, offset


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor (a view when it is contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


def as_byte_slot(slot: TensorSlot) -> TensorSlot:
    """The same bytes, seen as a flat uint8 tensor."""
    return TensorSlot(slot.offset, slot.nbytes, "uint8", (slot.nbytes,))


def from_buffer(buffer: Any, slot: TensorSlot) -> torch.Tensor:
    """A tensor over `buffer`'s bytes at `slot` (a view: clone it to keep it)."""
    dtype = getattr(torch, slot.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a tensor type: {slot.dtype!r}")
    if not slot.nbytes:
        return torch.empty(slot.shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=torch.uint8, count=slot.nbytes, offset=slot.offset)
    return flat.view(dtype).reshape(slot.shape)
