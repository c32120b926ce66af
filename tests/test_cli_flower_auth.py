"""`fedhier flower link`: node authentication is on by default with TLS, so an intruder's SuperNode that claims
a site's name is refused by the SuperLink instead of stopping the fit."""

from __future__ import annotations

import pytest

from fedhier.cli.flower import cli_flower


@pytest.mark.parametrize("options, authenticated", [
    (["--certificates", "certs"], True),
    (["--certificates", "certs", "--node-auth"], True),
    (["--certificates", "certs", "--no-node-auth"], False),
    (["--insecure"], False),
    (["--insecure", "--node-auth"], True),
])
def test_the_superlink_authenticates_supernodes_by_default_with_tls(tmp_path, monkeypatch, capsys, options,
                                                                     authenticated):
    (tmp_path / "certs").mkdir()
    for name in ("ca.pem", "server.pem", "server.key"):
        (tmp_path / "certs" / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert cli_flower(["link", *options, "--print-command"]) == 0
    command = capsys.readouterr().out.split()
    assert ("--enable-supernode-auth" in command) == authenticated
