"""A vector's bytes: float32 as providers give it, as the vector table stores it, as sqlite-vec quantizes it.

Vectors come in and go out as float32 whatever the table holds (float32 or float16: PRECISIONS in
vector_index); a vector with no direction (zero, NaN or infinite) is never stored.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["are_usable", "float32_of_half", "half_of_float32", "pad8", "padded_dims", "to_stored"]


def padded_dims(dims: int) -> int:
    return dims + (-dims) % 8


def pad8(blob: bytes) -> bytes:
    """vec_quantize_binary wants a multiple of 8 dimensions; zeros quantize to 0 bits, alike for every vector."""
    return blob + bytes(4 * ((-(len(blob) // 4)) % 8))


def are_usable(blobs: Sequence[bytes], dtype: str) -> list[bool]:
    """Whether each vector has a direction as it will be stored: a zero, NaN or infinite one must never match.

    Checked a batch at a time on the stored values (one vector at a time cost ~30 us each, a tenth
    of a cold hybrid index): every value finite and one not zero.
    """
    import numpy as np  # writers only: a CLI search never stores a vector

    if len({len(blob) for blob in blobs}) > 1:  # a wrong-sized vector: `put` refuses the batch after this
        return [are_usable([blob], dtype)[0] for blob in blobs]
    if not blobs:
        return []
    values = np.frombuffer(to_stored(b"".join(blobs), dtype), dtype=dtype).reshape(len(blobs), -1)
    usable: list[bool] = (np.isfinite(values).all(axis=1) & (values != 0).any(axis=1)).tolist()
    return usable


def to_stored(blob: bytes, dtype: str) -> bytes:
    """A float32 vector as the vector table stores it (`dtype`)."""
    if dtype == "<f4":
        return blob
    import numpy as np

    with np.errstate(over="ignore"):  # a value beyond float16's range becomes infinite: `are_usable` refuses it
        return np.frombuffer(blob, dtype="<f4").astype(dtype).tobytes()


def float32_of_half(blob: bytes | None) -> bytes | None:
    """A float16 blob as float32 (also the SQL function FLOAT32_SQL)."""
    if blob is None:
        return None
    import numpy as np

    return np.frombuffer(blob, dtype="<f2").astype("<f4").tobytes()


def half_of_float32(blob: bytes | None) -> bytes | None:
    """A float32 blob as float16 (the SQL function HALF_SQL); None where the vector would lose its direction."""
    if blob is None or not blob or len(blob) % 4:
        return None
    import numpy as np

    with np.errstate(over="ignore"):  # beyond float16's range: infinite, refused below
        half = np.frombuffer(blob, dtype="<f4").astype("<f2")
    return half.tobytes() if bool(np.isfinite(half).all() and (half != 0).any()) else None
