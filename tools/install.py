"""Install requirements into this interpreter's environment with uv, from where pip is configured to look.

`make install` spends most of its time unpacking torch and its CUDA libraries (about 5 GB): pip does it on one
core, uv in parallel, the same packages in well under half the time (docs/performance.md). uv reads no pip.conf,
so what pip is configured with (files and PIP_* variables, as `pip config list` reports them: the index, extra
indexes, find-links, constraints, a CA bundle) is passed on, and uv picks among the indexes as pip does. Where
uv cannot be installed, pip does the whole install.

    python tools/install.py -e '.[test]'

Bytecode is compiled once here for what is installed (a user may run with PYTHONDONTWRITEBYTECODE=1, and every
process would compile what it imports again), except for code nothing in rrtrain imports unless a user asks for it
(`UNCOMPILED`: Oracle Cloud's SDK, which streaming requires for oci:// datasets, is 40% of the Python installed;
transformers' model families and the packages' own test suites another 20%); Python compiles those on first use.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
from typing import Optional

#: pip's options that say where packages come from, as uv's flags
SOURCES = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}
#: installed code left uncompiled (a regular expression on the path, for `compileall -x`): Oracle Cloud's SDK, pip,
#: transformers' model families but `auto` (rrtrain's export and eval import its generic classes and `auto`; a family
#: is compiled when something first imports it), and the installed packages' own test suites (a `test` or `tests`
#: folder inside a package)
UNCOMPILED = (r"[/\\]site-packages[/\\](oci[/\\]|pip[/\\]|transformers[/\\]models[/\\](?!auto[/\\])[^/\\]+[/\\]"
              r"|[^/\\]+[/\\](?:[^/\\]+[/\\])*tests?[/\\])")


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], text=True, capture_output=True)


def pip_settings() -> dict[str, list[str]]:
    """pip's configured options for `pip install`, by name: as for pip, `install.find-links` replaces
    `global.find-links`, and PIP_FIND_LINKS replaces both."""
    by_section: dict[str, dict[str, list[str]]] = {":env:": {}, "install": {}, "global": {}}
    for line in pip("config", "list").stdout.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and section in by_section:
            by_section[section][name] = str(ast.literal_eval(value)).split()  # pip writes key=repr(value)
    return by_section["global"] | by_section["install"] | by_section[":env:"]


def uv_command(requirements: list[str], settings: dict[str, list[str]]) -> list[str]:
    command = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable,
               "--index-strategy", "unsafe-best-match"]
    for name, flag in SOURCES.items():
        for value in settings.get(name, []):
            command += [flag, value]
    return command + requirements


def main(requirements: list[str]) -> int:
    if pip("install", "--quiet", "uv").returncode != 0:
        print("tools/install.py: uv could not be installed; installing with pip", file=sys.stderr)
        return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *requirements])
    settings = pip_settings()
    env = dict(os.environ)
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"][-1]
    code = subprocess.call(uv_command(requirements, settings), env=env)
    return code or compile_bytecode()


def compile_bytecode(site: Optional[list[str]] = None) -> int:
    """Bytecode for every installed module but `UNCOMPILED`'s (in `site`: the environment's site-packages), on
    every core. A file that does not compile (a template, another Python's syntax) is left as it is, as uv and pip
    leave it: 0."""
    if site is None:
        site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    subprocess.call([sys.executable, "-m", "compileall", "-qq", "-j", "0", "-x", UNCOMPILED, *site],
                    stdout=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
