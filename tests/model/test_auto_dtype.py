"""``--dtype auto``: bf16 only where the CPU has native bf16 matrix units (mocked /proc/cpuinfo flags), bf16 on CUDA,
fp32 elsewhere; the CLI says the choice and its reason in one stderr line."""

from __future__ import annotations

import argparse

import pytest
import torch

from specfold.cli.common import resolve_dtype
from specfold.model import loading
from specfold.model.loading import auto_dtype, cpu_flags, parse_dtype

AVX2_EPYC = "fpu vme de pse avx avx2 fma bmi2 sha_ni"
SAPPHIRE_RAPIDS = AVX2_EPYC + " avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"
ZEN4 = AVX2_EPYC + " avx512f avx512_bf16"


@pytest.mark.parametrize(
    ("flags", "expected", "named"),
    [(AVX2_EPYC, "fp32", None), (SAPPHIRE_RAPIDS, "bf16", "amx_bf16, avx512_bf16"), (ZEN4, "bf16", "avx512_bf16")],
)
def test_cpu_choice_from_cpuinfo_flags(tmp_path, flags, expected, named):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t: fpu\n")
    got = cpu_flags(info)
    assert got == frozenset(flags.split())  # the first CPU's line
    name, why = auto_dtype("cpu", got)
    assert name == expected
    if named is None:
        assert "emulated" in why
    else:
        assert named in why


def test_cuda_is_bf16_and_missing_cpuinfo_is_fp32(tmp_path):
    assert auto_dtype("cuda")[0] == "bf16"
    assert cpu_flags(tmp_path / "absent") == frozenset()
    assert auto_dtype("cpu", frozenset())[0] == "fp32"


def test_parse_dtype_auto_follows_the_flags(monkeypatch):
    monkeypatch.setattr(loading, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS.split()))
    assert parse_dtype("auto") is torch.bfloat16
    monkeypatch.setattr(loading, "cpu_flags", lambda: frozenset(AVX2_EPYC.split()))
    assert parse_dtype("auto") is torch.float32
    assert parse_dtype("auto", "cuda") is torch.bfloat16
    assert parse_dtype("bf16") is torch.bfloat16  # an explicit dtype is kept whatever the CPU
    with pytest.raises(ValueError, match="auto"):
        parse_dtype("fp8")


def test_cli_says_the_choice_once(monkeypatch, capsys):
    monkeypatch.setattr(loading, "cpu_flags", lambda: frozenset(ZEN4.split()))
    args = argparse.Namespace(dtype="auto", device="cpu")
    assert resolve_dtype(args) == "bf16" and args.dtype == "bf16"
    assert resolve_dtype(args) == "bf16"  # decided: no second line
    err = capsys.readouterr().err.splitlines()
    assert err == ["specfold: --dtype auto chose bf16: the CPU has native bf16 matrix units (avx512_bf16)"]
    explicit = argparse.Namespace(dtype="fp32", device="cpu")
    assert resolve_dtype(explicit) == "fp32" and capsys.readouterr().err == ""
