from cloudtrain import __version__


def test_version_prints_and_exits_zero(run_cli):
    done = run_cli("--version")
    assert done.code == 0
    assert done.stdout.strip() == f"cloudtrain {__version__}"


def test_unknown_command_is_a_usage_error(run_cli):
    done = run_cli("no-such-command")
    assert done.code == 2
    assert "no-such-command" in done.stderr
