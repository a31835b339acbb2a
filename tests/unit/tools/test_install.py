"""tools/install.py (`make install`): uv is given the sources pip is configured with, a variable over a file."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from trainutil import REPO


@pytest.fixture
def install(monkeypatch, tmp_path):
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CERT"):
        monkeypatch.delenv(name, raising=False)
    conf = tmp_path / "pip.conf"  # read after the machine's own files, so its keys win over theirs
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\n"
                    "extra-index-url =\n    file:///srv/a/simple\n    file:///srv/b/simple\n"
                    "find-links = /srv/wheels\ncert = /etc/site-ca.pem\n[install]\nconstraint = /srv/caps.txt\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    spec = importlib.util.spec_from_file_location("install", REPO / "tools" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flags(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == flag]


def test_uv_gets_every_source_pip_is_configured_with(install):
    command = install.uv_command(["-e", ".[test]"], install.pip_settings())
    assert command[:5] == [sys.executable, "-m", "uv", "pip", "install"]
    assert flags(command, "--python") == [sys.executable]
    assert flags(command, "--index-url") == ["https://mirror.example/simple"]
    assert flags(command, "--extra-index-url") == ["file:///srv/a/simple", "file:///srv/b/simple"]
    assert flags(command, "--find-links") == ["/srv/wheels"]
    assert flags(command, "--constraint") == ["/srv/caps.txt"]
    assert flags(command, "--index-strategy") == ["unsafe-best-match"]  # any index may have the best version
    assert "--compile-bytecode" not in command  # compile_bytecode does it, but for UNCOMPILED
    assert command[-2:] == ["-e", ".[test]"]
    assert install.pip_settings()["cert"] == ["/etc/site-ca.pem"]


def test_a_pip_variable_replaces_the_files_value(install, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/here /opt/there")
    monkeypatch.setenv("PIP_INDEX_URL", "https://other.example/simple")
    settings = install.pip_settings()
    assert settings["find-links"] == ["/opt/here", "/opt/there"]
    assert settings["index-url"] == ["https://other.example/simple"]
    assert settings["extra-index-url"] == ["file:///srv/a/simple", "file:///srv/b/simple"]


def test_bytecode_is_compiled_but_for_what_rrtrain_never_imports(install, tmp_path):
    site = tmp_path / "lib" / "site-packages"
    compiled = ("torch/nn.py", "torch/testing/_internal/common.py", "transformers/models/__init__.py",
                "transformers/models/auto/modeling_auto.py")
    left = ("oci/core/models.py", "pip/_internal/main.py", "transformers/models/llama/modeling_llama.py",
            "numpy/_core/tests/test_umath.py", "scipy/stats/tests/test_stats.py", "pandas/tests/frame/test_api.py",
            "networkx/algorithms/test/x.py")
    for module in (*compiled, *left):
        (site / module).parent.mkdir(parents=True, exist_ok=True)
        (site / module).write_text("X = 1\n")
    (site / "pkg").mkdir()
    (site / "pkg" / "template.py").write_text("def {{ name }}(:\n")  # not Python: left as it is
    assert install.compile_bytecode([str(site)]) == 0
    for module in compiled:
        path = site / module
        assert list((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc")), module
    for module in left:
        assert not list((site / module).parent.rglob("*.pyc")), module
    assert not list((site / "pkg").rglob("*.pyc"))
