#!/usr/bin/env python3
"""The Debian mirror and apt proxy this machine's apt is configured with, for the stand-in build.

The stand-ins (build.sh) debootstrap Debian bookworm. The mirror that is known to answer here is the
one the machine's own apt uses — its configured mirror, or the proxy in front of it — so it is read
from the machine's apt configuration, and no mirror host is written into the repository:

- the mirror: the first enabled `deb` source of Debian's archive (a suite named for a Debian release,
  with the `main` component; not the security archive) in /etc/apt/sources.list and
  /etc/apt/sources.list.d/*.list (one-line style) and *.sources (deb822 style), in apt's order;
- the proxy: Acquire::http::Proxy (Acquire::https::Proxy for an https mirror) of /etc/apt/apt.conf and
  /etc/apt/apt.conf.d/*, flat (`Acquire::http::Proxy "URL";`) or nested (`Acquire { http { Proxy …`).

Prints shell assignments for build.sh to evaluate: `MIRROR='URL'` and `APT_PROXY='URL'` (empty when
none). When no Debian source is found it says which files it read and what to set (DEBIAN_MIRROR), and
exits 1. Standard library only; `--root DIR` reads DIR/etc/apt instead of /etc/apt (tests).

    docker/standins/apt_sources.py [--root DIR]
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

#: the suites a Debian archive serves (release names and aliases); a third-party source's suite differs
DEBIAN_SUITES = frozenset(
    {
        "buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid",
        "oldoldstable", "oldstable", "stable", "testing", "unstable",
    }
)  # fmt: skip
#: URI schemes debootstrap can fetch from (apt's `mirror+`, `cdrom:`, `tor+` … it cannot)
FETCHABLE = ("http://", "https://", "ftp://", "file:/")


@dataclass(frozen=True)
class Source:
    """One `deb` source: where it was read, its URI, suites and components."""

    origin: str
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]

    def is_debian(self) -> bool:
        """Debian's archive: a release's suite with `main`, from a URI debootstrap can fetch."""
        return (
            self.uri.startswith(FETCHABLE)
            and "main" in self.components
            and any(s in DEBIAN_SUITES for s in self.suites)
            and not self.uri.rstrip("/").endswith("-security")
        )


def source_files(etc: Path) -> list[Path]:
    """The files apt reads its sources from, in apt's order."""
    files = [etc / "sources.list"]
    parts = etc / "sources.list.d"
    if parts.is_dir():
        files += sorted(
            p for p in parts.iterdir() if p.is_file() and re.fullmatch(r"[\w.-]+\.(list|sources)", p.name)
        )
    return [f for f in files if f.is_file()]


def one_line_sources(path: Path) -> list[Source]:
    """`deb [options] URI suite [component…]` lines (a .list file, or sources.list)."""
    found = []
    for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        line = re.sub(r"\[[^\]]*\]", " ", line)  # [arch=amd64 signed-by=…]
        words = line.split()
        if len(words) >= 3 and words[0] == "deb":
            found.append(Source(f"{path}:{n}", words[1], (words[2],), tuple(words[3:])))
    return found


def deb822_sources(path: Path) -> list[Source]:
    """Stanzas of `Types:`, `URIs:`, `Suites:`, `Components:` (`Enabled: no` skipped; a .sources file)."""
    found = []
    stanzas: list[dict[str, str]] = [{}]
    key = None
    for raw in path.read_text(errors="replace").splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if stanzas[-1]:
                stanzas.append({})
            key = None
            continue
        if raw[0] in " \t" and key is not None:  # a continuation line
            stanzas[-1][key] += " " + raw.strip()
            continue
        name, sep, value = raw.partition(":")
        if sep:
            key = name.strip().lower()
            stanzas[-1][key] = value.strip()
    for i, stanza in enumerate(s for s in stanzas if s):
        if "deb" not in stanza.get("types", "").split() or stanza.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(stanza.get("suites", "").split())
        components = tuple(stanza.get("components", "").split())
        for uri in stanza.get("uris", "").split():
            found.append(Source(f"{path} (stanza {i + 1})", uri, suites, components))
    return found


def debian_mirror(etc: Path) -> str | None:
    """The URI of the first Debian source apt has (`Source.is_debian`); None when there is none."""
    for path in source_files(etc):
        sources = deb822_sources(path) if path.suffix == ".sources" else one_line_sources(path)
        for source in sources:
            if source.is_debian():
                return source.uri.rstrip("/")
    return None


def conf_files(etc: Path) -> list[Path]:
    """apt.conf, then apt.conf.d's files as apt reads them (names of letters, digits, `_-.`; an
    extension only `.conf`), in order."""
    files = [etc / "apt.conf"]
    parts = etc / "apt.conf.d"
    if parts.is_dir():
        files += sorted(
            p
            for p in parts.iterdir()
            if p.is_file() and re.fullmatch(r"[\w.-]+", p.name) and ("." not in p.name or p.suffix == ".conf")
        )
    return [f for f in files if f.is_file()]


TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{};]|[^\s{};"]+')
COMMENT = re.compile(r'("(?:[^"\\]|\\.)*")|/\*.*?\*/|//[^\n]*', re.DOTALL)


def conf_values(text: str) -> dict[str, str]:
    """apt.conf's settings as full lowercase names → values: `a::b "v";` and `a { b "v"; };` alike."""
    text = COMMENT.sub(lambda m: m.group(1) or " ", text)  # /* … */ and // … outside quotes
    kept = [line for line in text.splitlines() if not line.lstrip().startswith("#")]  # #include, #clear
    text = "\n".join(kept)
    scope: list[str] = []
    values: dict[str, str] = {}
    words: list[str] = []
    for token in TOKEN.findall(text):
        if token == "{":
            scope.append("::".join(words).lower())
            words = []
        elif token == "}":
            if scope:
                scope.pop()
            words = []
        elif token == ";":
            if len(words) >= 2:
                name = "::".join([*scope, words[0].lower()])
                values[name] = words[-1].strip('"')
            words = []
        else:
            words.append(token)
    return values


def apt_proxy(etc: Path, scheme: str) -> str | None:
    """Acquire::<scheme>::Proxy of the machine's apt configuration (the last setting wins, as in apt);
    None when none is set, or it is DIRECT / false."""
    proxy = None
    for path in conf_files(etc):
        value = conf_values(path.read_text(errors="replace")).get(f"acquire::{scheme}::proxy")
        if value is not None:
            proxy = value
    return None if proxy is None or proxy.strip().lower() in ("", "direct", "false") else proxy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=Path("/"), help="read ROOT/etc/apt (default: /)")
    args = parser.parse_args(argv)
    etc = args.root / "etc" / "apt"
    mirror = debian_mirror(etc)
    if mirror is None:
        read = (
            ", ".join(str(p) for p in source_files(etc)) or f"none: {etc}/sources.list(.d) has no source file"
        )
        print(
            f"stand-ins: no Debian mirror in this machine's apt sources (read: {read}); a `deb` source of "
            "Debian's archive (suite bookworm, stable, …, component main) is the mirror the stand-ins "
            "build from. Set DEBIAN_MIRROR to a Debian mirror this machine reaches (the URI of such a "
            "source, e.g. DEBIAN_MIRROR=http://<your mirror>/debian), and APT_PROXY=http://<host>:<port> "
            "if it is reached through a proxy",
            file=sys.stderr,
        )
        return 1
    scheme = "https" if mirror.startswith("https://") else "http"
    proxy = apt_proxy(etc, scheme) or ""
    print(f"MIRROR={shlex.quote(mirror)}")
    print(f"APT_PROXY={shlex.quote(proxy)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
