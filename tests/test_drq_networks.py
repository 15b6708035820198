"""DrQ-v2 networks and random-shift augmentation, at tiny sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dm_env import specs

from projects.drq_v2.augmentations import crop_images, random_shift, shift_images
from projects.drq_v2.config import get_agent_config
from projects.drq_v2.networks import encoder_repr_dim, make_networks, sample_action

ACTION_DIM = 3
IMAGE = 16  # 16 -> 7 -> 5 -> 3 -> 1 through the four convs


def _tiny_config():
    config = get_agent_config()
    config.feature_dim = 8
    config.hidden_dim = 32
    config.encoder_channels = 4
    return config


def _networks(config=None):
    config = config or _tiny_config()
    action_spec = specs.BoundedArray((ACTION_DIM,), np.float32, -1.0, 1.0)
    return make_networks(action_spec, config), config


def test_paper_encoder_repr_dim_at_84():
    config = get_agent_config()
    assert encoder_repr_dim((84, 84), config) == 32 * 35 * 35
    networks, _ = _networks(config)
    obs = jax.ShapeDtypeStruct((2, 84, 84, 9), jnp.uint8)
    params = jax.eval_shape(networks.encoder_init, jax.random.PRNGKey(0), obs)
    out = jax.eval_shape(networks.encoder_apply, params, obs)
    assert out.shape == (2, 39200)


def test_output_shapes_and_ranges():
    networks, config = _networks()
    obs = np.random.default_rng(0).integers(0, 256, (5, IMAGE, IMAGE, 9), dtype=np.uint8)
    params = networks.init(jax.random.PRNGKey(0), obs[0])
    assert set(params) == {"encoder", "actor", "critic"}
    features = networks.encoder_apply(params["encoder"], obs)
    assert features.shape == (5, encoder_repr_dim((IMAGE, IMAGE), config))
    mean = networks.actor_apply(params["actor"], features)
    assert mean.shape == (5, ACTION_DIM)
    assert np.all(np.abs(np.asarray(mean)) < 1.0)
    q1, q2 = networks.critic_apply(params["critic"], features, mean)
    assert q1.shape == q2.shape == (5,)
    assert not np.allclose(q1, q2)  # two independently initialised heads
    # uint8 and float inputs in 0..255 encode the same.
    float_features = networks.encoder_apply(params["encoder"], obs.astype(np.float32))
    np.testing.assert_allclose(features, float_features, rtol=1e-5, atol=1e-5)


def test_actor_and_critic_have_their_own_trunks():
    networks, _ = _networks()
    params = networks.init(jax.random.PRNGKey(0), np.zeros((IMAGE, IMAGE, 9), np.uint8))
    actor_trunk = params["actor"]["trunk_linear"]["w"]
    critic_trunk = params["critic"]["trunk_linear"]["w"]
    assert actor_trunk.shape == critic_trunk.shape
    assert not np.allclose(actor_trunk, critic_trunk)


def test_orthogonal_init_and_zero_biases():
    networks, config = _networks()
    params = networks.init(jax.random.PRNGKey(1), np.zeros((IMAGE, IMAGE, 9), np.uint8))
    hidden = np.asarray(params["critic"]["q1/~/linear_1"]["w"])  # [32, 32]
    np.testing.assert_allclose(hidden.T @ hidden, np.eye(config.hidden_dim), atol=1e-4)
    conv = np.asarray(params["encoder"]["conv_1"]["w"])  # [3, 3, 4, 4] -> [36, 4]
    flat = conv.reshape(-1, conv.shape[-1])
    np.testing.assert_allclose(flat.T @ flat, 2.0 * np.eye(flat.shape[1]), atol=1e-4)
    for tree in params.values():
        for name, leaves in tree.items():
            if "b" in leaves and "norm" not in name:
                assert not np.any(np.asarray(leaves["b"])), name


def test_sample_action_clips_noise_and_clamps():
    mean = jnp.array([[0.0, 0.95, -0.95]] * 2000)
    action = sample_action(jax.random.PRNGKey(0), mean, 1.0, 0.3, 1e-6)
    noise = np.asarray(action - mean)
    assert np.all(np.abs(noise[:, 0]) <= 0.3 + 1e-6)
    assert np.all(np.abs(np.asarray(action)) < 1.0)
    # Straight-through clamp: gradient wrt the mean is 1 everywhere.
    grad = jax.grad(lambda m: sample_action(jax.random.PRNGKey(0), m, 1.0, 0.3, 1e-6).sum())(mean)
    np.testing.assert_array_equal(grad, np.ones_like(mean))


def _dot_image(y, x, size=12, channels=3):
    image = np.zeros((size, size, channels), np.float32)
    image[y, x, :] = 255.0
    return image


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_shift_images_is_a_pure_integer_shift(dtype):
    pad = 4
    images = np.stack([_dot_image(6, 6), _dot_image(5, 7)]).astype(dtype)
    shifts = jnp.array([[pad + 2, pad - 3], [pad, pad]], jnp.float32)  # (dy, dx)
    out = np.asarray(shift_images(jnp.asarray(images), shifts, pad))
    assert out.dtype == images.dtype and out.shape == images.shape
    # output[i, j] = input[i + dy - pad, j + dx - pad]: the dot moves by (pad - dy, pad - dx).
    np.testing.assert_array_equal(out[0], _dot_image(4, 9).astype(dtype))
    np.testing.assert_array_equal(out[1], images[1])


def test_shift_images_replicates_edges():
    image = np.zeros((1, 8, 8, 1), np.float32)
    image[0, 0, :, 0] = 7.0  # top row bright
    out = np.asarray(shift_images(jnp.asarray(image), jnp.array([[0.0, 4.0]]), 4))
    # Shifted down by 4 rows: the replicated top row fills rows 0..4.
    np.testing.assert_array_equal(out[0, :5, :, 0], 7.0)
    np.testing.assert_array_equal(out[0, 5:, :, 0], 0.0)


def test_shift_images_fractional_is_bilinear():
    image = np.zeros((1, 8, 8, 1), np.float32)
    image[0, 3, 3, 0] = 1.0
    out = np.asarray(shift_images(jnp.asarray(image), jnp.array([[4.5, 4.0]]), 4))
    np.testing.assert_allclose(out[0, 2:4, 3, 0], [0.5, 0.5])
    assert out.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_random_shift_moves_a_dot_by_at_most_pad(dtype):
    pad, size, batch = 4, 16, 64
    images = np.stack([_dot_image(8, 8, size=size)] * batch).astype(dtype)
    out = np.asarray(random_shift(jax.random.PRNGKey(3), jnp.asarray(images), pad))
    assert out.dtype == images.dtype and out.shape == images.shape
    moves = set()
    for sample in out:
        ys, xs, _ = np.nonzero(sample)
        assert len(set(ys)) == 1 and len(set(xs)) == 1  # one dot, not smeared
        assert sample.max() == 255
        dy, dx = ys[0] - 8, xs[0] - 8
        assert abs(dy) <= pad and abs(dx) <= pad
        moves.add((dy, dx))
    assert len(moves) > 10  # per-sample shifts, not one shift for the batch


def test_random_shift_handles_non_square_images():
    images = jnp.ones((2, 10, 14, 6), jnp.float32)
    out = random_shift(jax.random.PRNGKey(0), images, 4)
    assert out.shape == images.shape
    np.testing.assert_array_equal(out, images)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_crop_images_equals_shift_images_at_integer_offsets(dtype):
    # random_shift crops (a batch-parallel gather, for data-parallel learners); the crop must
    # be exactly the official bilinear resampling at the integer offsets it draws.
    pad = 4
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (16, 12, 10, 6)).astype(dtype)
    offsets = rng.integers(0, 2 * pad + 1, (16, 2))
    cropped = np.asarray(crop_images(jnp.asarray(images), jnp.asarray(offsets), pad))
    shifted = np.asarray(shift_images(jnp.asarray(images), jnp.asarray(offsets, jnp.float32), pad))
    assert cropped.dtype == images.dtype
    np.testing.assert_array_equal(cropped, shifted)
