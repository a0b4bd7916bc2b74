"""JAX takes batch columns through DLPack without a copy (jax[cpu];
ci/pytest.sh installs it and sets GEAR_REQUIRE_TORCH=1 so this runs).
JAX runs in a child interpreter: it starts threads, and other tests fork
(DataLoader workers), which must not happen in a process running JAX."""

from conftest import require_installed, run_child

CHECK = """
import numpy as np, gear
import jax.numpy as jnp

table = gear.Table([("obs", "float32", (3,)), ("h", "bfloat16"), ("a", "int32")], max_len=2, capacity=8)
with table.writer().trajectory() as t:
    t.append(obs=np.array([1, 2, 3], np.float32), h=1.5, a=7)
    t.append(obs=np.array([4, 5, 6], np.float32), h=-2.0, a=8)
batch = table.sampler(4, window=2).sample()
obs = jnp.from_dlpack(batch.dlpack("obs"))
assert obs.shape == (4, 2, 3) and obs.dtype == jnp.float32
np.testing.assert_array_equal(np.asarray(obs), batch["obs"])
h = jnp.from_dlpack(batch.dlpack("h"))
assert h.dtype == jnp.bfloat16 and np.asarray(h, np.float32)[0].tolist() == [1.5, -2.0]
a = jnp.from_dlpack(batch.dlpack("a"))
assert a.dtype == jnp.int32 and int(a[0, 1]) == 8
assert float(jnp.sum(obs)) == 4 * 21
print("ok")
"""


def test_jax_from_dlpack_reads_the_batch_columns():
    require_installed("jax")
    out = run_child(CHECK, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
