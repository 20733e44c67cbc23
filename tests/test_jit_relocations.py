"""Host objects carry no 32-bit PC-relative relocations: MCJIT maps an object's sections with separate mmaps, and
after thousands of compiles in one process they can land > 2 GiB apart (the CI suite segfaulted at its 4,256th
test; LLVM with assertions aborts in RuntimeDyldELF::resolveX86_64Relocation). kiln/codegen/jit.py: code_model."""
from __future__ import annotations

import shutil
import subprocess

import pytest

import kiln
from kiln.target import host
from kiln.zoo import build

# relocations whose field is 32 bits wide relative to the place: they overflow between far-apart sections
PC32 = ("R_X86_64_PC32", "R_X86_64_PLT32", "R_X86_64_GOTPCREL", "R_X86_64_GOTPCRELX", "R_X86_64_REX_GOTPCRELX",
        "R_X86_64_32", "R_X86_64_32S")


@pytest.mark.skipif(host().arch != "x86_64", reason="the x86-64 code model")
@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) lists the relocations")
@pytest.mark.parametrize("bounds_check", [True, False])  # one module (the debug build), or split into compile units
def test_no_32bit_relocations_in_host_objects(tmp_path, bounds_check: bool) -> None:  # noqa: ANN001
    exe = kiln.compile(build("mobilenetv2"), num_threads=2, cache=False, bounds_check=bounds_check, tuning="off")
    kinds: set[str] = set()
    for i, obj in enumerate(exe.objs):
        path = tmp_path / f"module{i}.o"
        path.write_bytes(obj)
        listing = subprocess.run(["readelf", "-rW", str(path)], capture_output=True, text=True, check=True).stdout
        kinds |= {line.split()[2] for line in listing.splitlines()
                  if line[:1] in "0123456789abcdef" and len(line.split()) > 2}
    assert kinds, "no relocations listed: the check would pass vacuously"
    assert not kinds & set(PC32), f"32-bit relocations in a host object: {sorted(kinds & set(PC32))}"
