"""A plugin's identity (docs/plugins.md, 'Identity'): which files its code digest hashes, as
`memsweep plugins --files NAME` lists them, and an editable install whose source names a version pip has
not installed yet, as `memsweep plugins` and its check say."""

from __future__ import annotations

import json
from pathlib import Path

from service.api.schemas import PluginPublic
from tests.plugin_dists import memsweep, toy_dist


def _listed(site: Path) -> dict[str, object]:
    done = memsweep("plugins", "--json", paths=(site,))
    assert done.returncode == 0, done.stderr[-2000:]
    (plugin,) = json.loads(done.stdout)["server"]
    return plugin  # type: ignore[no-any-return]


def test_an_editors_leftovers_leave_a_plugins_identity_as_it_was_and_its_data_files_move_it(
    tmp_path: Path,
) -> None:
    site = toy_dist(tmp_path / "site", "1.0")
    package = site / "memsweep_toy"
    before = _listed(site)["digest"]
    source = (package / "__init__.py").read_text()
    for leftover in ("__init__.py.orig", "__init__.py.rej", "__init__.py~", "#__init__.py#", "cell.py.bak"):
        (package / leftover).write_text(source)
    assert _listed(site)["digest"] == before  # the same code: the same trials
    (package / "table.json").write_text("[1, 2]")
    with_data = _listed(site)["digest"]
    assert with_data != before  # data a plugin ships is part of what it computes
    (package / "table.json").write_text("[1, 3]")
    assert _listed(site)["digest"] not in (before, with_data)

    shown = memsweep("plugins", "--files", "toy", paths=(site,))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert (
        f"cell 'toy' (memsweep-toy==1.0+{_listed(site)['digest']}): its code digest hashes 2 files"
        in shown.stdout
    )
    assert "  __init__.py\n" in shown.stdout and "  table.json\n" in shown.stdout
    assert (
        "left out (an editor's or a merge's leftovers): " in shown.stdout
        and "__init__.py.orig" in shown.stdout
    )
    (report,) = json.loads(memsweep("plugins", "--files", "cell:toy", "--json", paths=(site,)).stdout)
    assert (
        sorted(report["hashed"]) == ["__init__.py", "table.json"]
        and len(report["hashed"]["table.json"]) == 16
    )
    assert sorted(report["left_out"]) == sorted(
        ["#__init__.py#", "__init__.py.orig", "__init__.py.rej", "__init__.py~", "cell.py.bak"]
    )
    assert "no plugin 'other'" in memsweep("plugins", "--files", "other", paths=(site,)).stderr


def _editable(site: Path, source: Path, version: str) -> None:
    """The toy distribution in `site` as `pip install -e SOURCE` leaves it (PEP 610), its source naming
    `version`."""
    source.mkdir(parents=True, exist_ok=True)
    (source / "pyproject.toml").write_text(f'[project]\nname = "memsweep-toy"\nversion = "{version}"\n')
    (info,) = site.glob("*.dist-info")
    url = {"url": source.as_uri(), "dir_info": {"editable": True}}
    (info / "direct_url.json").write_text(json.dumps(url))


def test_an_editable_installs_version_bump_not_yet_installed_is_named_with_what_to_run(
    tmp_path: Path,
) -> None:
    site = toy_dist(tmp_path / "site", "0.1.0")
    source = tmp_path / "my cell"
    _editable(site, source, "0.1.0")
    assert _listed(site)["version_behind"] is None

    _editable(site, source, "0.2.0")
    why = f"version 0.2.0 in {source / 'pyproject.toml'}, 0.1.0 installed: run pip install -e {source} again"
    plugin = _listed(site)
    assert plugin["version"] == "0.1.0" and plugin["version_behind"] == why
    assert PluginPublic.model_validate(plugin).version_behind == why  # GET /plugins answers it too
    listed = memsweep("plugins", paths=(site,))
    assert listed.returncode == 0 and f"cell 'toy': {why}" in listed.stdout
    checked = memsweep("plugins", "check", "toy", paths=(site,))
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]  # the contract holds all the same
    assert "holds its contract" in checked.stdout and f"note: {why}" in checked.stdout


def test_a_version_spelt_otherwise_in_the_source_is_no_version_behind(tmp_path: Path) -> None:
    """`1.0.0-beta1` in pyproject.toml is the `1.0.0b1` pip installs: no note after every reinstall."""
    site = toy_dist(tmp_path / "site", "1.0.0b1")
    _editable(site, tmp_path / "source", "1.0.0-beta1")
    assert _listed(site)["version_behind"] is None
