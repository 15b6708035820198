"""Random-shift image augmentation of DrQ-v2 (the official `RandomShiftsAug`) in JAX.

The official augmentation replicate-pads each image by `pad` pixels and resamples an
HxW window with `grid_sample` (bilinear, align_corners=False) at a per-sample offset
drawn as integers in [0, 2*pad] for x and y independently. At integer offsets the
bilinear weights are exactly 0 and 1, so the result is a pure crop of the padded image.
`shift_images` writes the bilinear resampling out (separable, one dynamic slice per tap;
exact for integer shifts, correct for fractional ones); `random_shift`, what the learner
runs, draws the same integer offsets and crops directly, on the images' own dtype (uint8
from replay): the same output for a third of the CPU time (one byte copy, not four float
taps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def shift_images(images: jax.Array, shifts: jax.Array, pad: int) -> jax.Array:
    """Bilinear resampling of replicate-padded images at per-sample offsets.

    Args:
        images: [B, H, W, C], any real dtype.
        shifts: [B, 2] float offsets (dy, dx) in padded-image pixels, each in [0, 2*pad];
            output[b, i, j] = padded[b, i + dy, j + dx] (interpolated when fractional).
        pad: replicate padding on every side.

    Returns:
        [B, H, W, C] of the input dtype (integer dtypes are rounded back).
    """
    _, height, width, channels = images.shape
    padded = jnp.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    padded = padded.astype(jnp.float32)
    shifts = jnp.clip(shifts.astype(jnp.float32), 0.0, 2.0 * pad)

    def one(image: jax.Array, shift: jax.Array) -> jax.Array:
        base = jnp.floor(shift)
        frac = shift - base
        y0, x0 = base.astype(jnp.int32)
        # dynamic_slice clamps a start that runs past the edge; that tap then has weight 0.
        rows0 = jax.lax.dynamic_slice(image, (y0, 0, 0), (height, width + 2 * pad, channels))
        rows1 = jax.lax.dynamic_slice(image, (y0 + 1, 0, 0), (height, width + 2 * pad, channels))
        rows = (1.0 - frac[0]) * rows0 + frac[0] * rows1
        cols0 = jax.lax.dynamic_slice(rows, (0, x0, 0), (height, width, channels))
        cols1 = jax.lax.dynamic_slice(rows, (0, x0 + 1, 0), (height, width, channels))
        return (1.0 - frac[1]) * cols0 + frac[1] * cols1

    out = jax.vmap(one)(padded, shifts)
    if jnp.issubdtype(images.dtype, jnp.integer):
        out = jnp.round(out)
    return out.astype(images.dtype)


def random_shift(key: jax.Array, images: jax.Array, pad: int = 4) -> jax.Array:
    """DrQ-v2's augmentation: every image shifted by its own integer (dy, dx) in [-pad, pad].

    Args:
        key: PRNG key.
        images: [B, H, W, C] batch (uint8 or float); shape and dtype are kept.
        pad: maximum shift in pixels (4 in the paper); borders repeat the edge pixels.
    """
    shifts = jax.random.randint(key, (images.shape[0], 2), 0, 2 * pad + 1)
    return crop_images(images, shifts, pad)


def crop_images(images: jax.Array, shifts: jax.Array, pad: int) -> jax.Array:
    """`shift_images` for integer shifts: one crop of the replicate-padded image per sample.

    Args:
        images: [B, H, W, C], any dtype (kept).
        shifts: [B, 2] integer offsets (dy, dx) in [0, 2*pad]; output[b, i, j] =
            padded[b, i + dy, j + dx].
        pad: replicate padding on every side.
    """
    _, height, width, channels = images.shape
    padded = jnp.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    shifts = shifts.astype(jnp.int32)

    def one(image: jax.Array, shift: jax.Array) -> jax.Array:
        return jax.lax.dynamic_slice(image, (shift[0], shift[1], 0), (height, width, channels))

    return jax.vmap(one)(padded, shifts)
