"""One number as a framework hands it back: a 0-d tensor of PyTorch, TensorFlow or JAX, a
NumPy scalar or 0-d array, made a float in the trial process.

Duck-typed on `shape` and `item()` or `__float__` (TensorFlow's tensors have no `item()`),
never by importing a framework: a trial that uses one has it imported already, and
importing another here would cost seconds and could touch a GPU (docs/design.md,
"Frameworks")."""

from __future__ import annotations

from typing import Any


class NotOneNumber(TypeError):
    """Raised when a value is an array or tensor that holds other than one real number, or
    an int past a float's range."""


def one_number(value: object) -> float | None:
    """`value` as a float; None when it is no number at all (text, None, a list, a bool,
    which is not a metric); `NotOneNumber` saying what it was for an array or tensor that
    is not one real number, or an int no float holds (`10**400`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # only an int overflows: its digits, not the number itself
            digits = _digits(int(value))
            raise NotOneNumber(f"an int of about {digits} digits, past a float's range") from None
    if not _is_array(value):
        return None
    return _array_number(value, _dims(getattr(value, "shape", ())))


def describe(value: object) -> str:
    """What a value was, in a few words (`tensor of shape (3,)`, `str`)."""
    if not _is_array(value):
        return type(value).__name__
    return f"{_kind(value)} of shape {_dims(getattr(value, 'shape', ()))}"


def _array_number(value: Any, dims: tuple[int | None, ...]) -> float | None:
    """The one number of a 0-d array or tensor; a boolean one is no metric."""
    if dims != ():
        raise NotOneNumber(f"{describe(value)}, not one number")
    dtype = str(getattr(value, "dtype", ""))
    if "bool" in dtype:
        return None
    if "complex" in dtype:
        raise NotOneNumber(f"{_kind(value)} of dtype {dtype}, not a real number")
    # item() first: torch warns when a tensor that requires grad is made a float directly
    return float(value.item() if hasattr(value, "item") else value)


def _is_array(value: object) -> bool:
    """Whether a value looks like a framework's array or tensor, or a NumPy scalar."""
    has_number = hasattr(value, "item") or hasattr(value, "__float__")
    return getattr(value, "shape", None) is not None and has_number


def _dims(shape: Any) -> tuple[int | None, ...]:
    """A shape as a plain tuple (TensorFlow's `TensorShape` may hold None for unknown)."""
    try:
        return tuple(None if d is None else int(d) for d in shape)
    except TypeError:  # a TensorShape of unknown rank
        return (None,)


def _digits(value: int) -> int:
    """How many decimal digits an int has, without writing it out (Python refuses to write
    ints of over 4300 digits)."""
    return int(abs(value).bit_length() * 0.30103) + 1


def _kind(value: object) -> str:
    return "tensor" if "Tensor" in type(value).__name__ else "array"
