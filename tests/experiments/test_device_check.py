"""experiments.device_check at its smoke size on the CPU (Pallas GPU kernels in interpret mode):
every kernel agrees with its reference, DEVICE.md is written whole, and the paper size carries
the sparse_decode / kv_quant paper settings."""

import jax
import pytest

from experiments import device_check


@pytest.mark.slow
def test_smoke_run_checks_every_gpu_kernel_and_writes_the_report(tmp_path):
    out = tmp_path / "DEVICE.md"
    result = device_check.run("smoke", str(out))
    assert result["passed"]
    kernels = {c["kernel"] for c in result["checks"]}
    assert kernels == {"FFD pallas_gpu", "jax decode_attention", "QVG pallas_gpu"}
    tol = device_check.SIZES["smoke"].tolerance
    assert all(0 <= c["rel_err"] <= tol for c in result["checks"])
    ffd = next(c for c in result["checks"] if c["kernel"] == "FFD pallas_gpu")
    assert 0 < ffd["density"] < 1  # the concentrated workload makes FFD skip pages
    assert all(r["ffd_ms"] > 0 and r["vs_flash"] > 0 for r in result["ffd"])
    assert [r["context"] for r in result["qvg"]] == [256]
    text = out.read_text()
    assert text.count("| yes |") == 3 and "**no**" not in text
    assert "| 512 | 2 |" in text and "11.6x" in text and "under 4%" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DEVICE.md"]  # no temporary left


def test_paper_size_uses_the_paper_configs():
    from experiments.configs import kv_quant, sparse_decode

    size, sd, kq = (device_check.SIZES["paper"], sparse_decode.get_config("paper"),
                    kv_quant.get_config("paper"))
    assert (size.page_size, size.delta) == (sd.page_size, sd.delta)
    assert (size.qvg_chunk, size.qvg_centroids, size.qvg_block, size.qvg_bits,
            size.qvg_kmeans_iters) == (kq.chunk, kq.num_centroids, kq.qvg_block, kq.bits,
                                       kq.kmeans_iters)
    assert (size.num_heads, size.num_kv_heads, size.head_dim) == (32, 8, 128)
    assert size.contexts == (32768, 65536, 131072, 262144) and size.batches == (1, 8)


def test_bad_size_and_no_gpu_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="size 'huge' is not one of"):
        device_check.run("huge", str(tmp_path / "D.md"))
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    assert device_check.main(["--size=paper", f"--out={tmp_path / 'D.md'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs a GPU" in err and "jax[cuda12]" in err
    assert not (tmp_path / "D.md").exists()
