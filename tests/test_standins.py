"""The stand-in build's Debian mirror and apt proxy, read from the machine's apt configuration
(docker/standins/apt_sources.py) — on fixture files, without Docker (issue 35 item 7: the build fell
back to a mirror written into the script, where the machine's own apt sources are the ones known to
answer)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[1] / "docker"
SCRIPT = DOCKER / "standins" / "apt_sources.py"

DEB822 = """\
Types: deb
URIs: http://disabled.mirror.test/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://sources.mirror.test/debian
Suites: bookworm
Components: main

Types: deb
# http://snapshot.mirror.test/archive/debian/20250520T000000Z
URIs: http://deb.mirror.test/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.mirror.test/debian-security
Suites: bookworm-security
Components: main
"""


def apt(root: Path, files: dict[str, str]) -> Path:
    """`root`/etc/apt holding `files` (paths relative to etc/apt)."""
    for name, text in files.items():
        path = root / "etc" / "apt" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def found(root: Path) -> subprocess.CompletedProcess[str]:
    """What build.sh evaluates: the script's assignments, evaluated by bash, echoed back."""
    return subprocess.run(
        ["bash", "-c", f'set -e; found=$({sys.executable} {SCRIPT} --root {root}); eval "$found"; echo "$MIRROR|$APT_PROXY"'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_deb822_source_gives_the_mirror(tmp_path: Path) -> None:
    root = apt(
        tmp_path,
        {
            "sources.list.d/debian.sources": DEB822,
            "sources.list.d/nodesource.sources": "Types: deb\nURIs: https://third.party.test/node\n"
            "Suites: nodistro\nComponents: main\n",
            "sources.list.d/old.sources.disabled": "Types: deb\nURIs: http://ignored.test/debian\n"
            "Suites: bookworm\nComponents: main\n",
        },
    )
    out = found(root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "http://deb.mirror.test/debian|"  # no proxy configured


def test_a_one_line_source_and_a_proxy(tmp_path: Path) -> None:
    root = apt(
        tmp_path,
        {
            "sources.list": "# deb http://commented.test/debian bookworm main\n"
            "deb-src http://sources.test/debian bookworm main\n"
            "deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://packages.vendor.test/apt vendor-bookworm main\n"
            "deb [arch=amd64] http://classic.mirror.test/debian bookworm main contrib  # the archive\n",
            "sources.list.d/debian.sources": DEB822,  # sources.list comes first, as apt reads them
            "apt.conf.d/00other": 'APT::Install-Recommends "false";\n',
            "apt.conf.d/01proxy": '// the site proxy\nAcquire::http::Proxy "http://proxy.test:3128/";\n',
            "apt.conf.d/02proxy.disabled": 'Acquire::http::Proxy "http://ignored.test:1/";\n',
            "apt.conf.d/03direct": 'Acquire::http::Proxy::classic.mirror.test "DIRECT";\n',
        },
    )
    out = found(root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "http://classic.mirror.test/debian|http://proxy.test:3128/"


def test_a_nested_proxy_setting_and_an_https_mirror(tmp_path: Path) -> None:
    root = apt(
        tmp_path,
        {
            "sources.list": "deb https://secure.mirror.test/debian stable main\n",
            "apt.conf": '/* two proxies */\nAcquire {\n  http { Proxy "http://plain.test:80"; };\n'
            '  https::Proxy "http://tls.test:8080";\n};\n',
        },
    )
    out = found(root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "https://secure.mirror.test/debian|http://tls.test:8080"


def test_a_proxy_set_to_direct_is_none(tmp_path: Path) -> None:
    root = apt(
        tmp_path,
        {
            "sources.list": "deb http://a.mirror.test/debian bookworm main\n",
            "apt.conf.d/10proxy": 'Acquire::http::Proxy "http://proxy.test:3128";\n',
            "apt.conf.d/20direct": 'Acquire::http::Proxy "DIRECT";\n',  # read later: it wins
        },
    )
    assert found(root).stdout.strip() == "http://a.mirror.test/debian|"


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"sources.list": "deb http://archive.ubuntu.test/ubuntu noble main\n"},
        {"sources.list.d/debian.sources": "\n\n".join(DEB822.split("\n\n")[:2] + DEB822.split("\n\n")[3:])},
    ],
)
def test_no_debian_source_fails_saying_what_to_set(tmp_path: Path, files: dict[str, str]) -> None:
    out = found(apt(tmp_path, files))
    assert out.returncode != 0 and out.stdout == ""
    assert "no Debian mirror in this machine's apt sources" in out.stderr
    assert "Set DEBIAN_MIRROR to a Debian mirror" in out.stderr and "APT_PROXY" in out.stderr


def test_this_machines_apt_answers_or_says_what_to_set() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    if out.returncode == 0:
        assert re.fullmatch(r"MIRROR=\S+\nAPT_PROXY=\S*\n", out.stdout), out.stdout
    else:
        assert "DEBIAN_MIRROR" in out.stderr


def test_no_registry_or_mirror_host_is_written_into_docker() -> None:
    """The images' files name no registry or mirror host: URLs reach compose's services or loopback."""
    hosts = set()
    for path in DOCKER.rglob("*"):
        if path.is_file():
            hosts |= set(re.findall(r"(?:https?|ftp)://([A-Za-z0-9_.-]+)", path.read_text(errors="replace")))
    assert {h for h in hosts if "." in h and h != "127.0.0.1"} == set(), hosts
    assert not re.search(r"DEBIAN_MIRROR:-[^}]", (DOCKER / "standins" / "build.sh").read_text())  # no default
