from cloudtrain import __version__


def test_version_prints_and_exits_zero(run_cli):
    done = run_cli("--version")
    assert done.code == 0
    assert done.stdout.strip() == f"cloudtrain {__version__}"


def test_unknown_command_is_a_usage_error(run_cli):
    done = run_cli("no-such-command")
    assert done.code == 2
    assert "no-such-command" in done.stderr


def test_a_user_error_exits_2_and_debug_adds_the_traceback(run_cli):
    plain = run_cli("offers", "--gpu", "H10")
    assert plain.code == 2 and plain.stderr.startswith("error: unknown GPU 'H10'")
    assert len(plain.stderr.strip().splitlines()) == 1
    debug = run_cli("--debug", "offers", "--gpu", "H10")
    assert debug.code == 2 and "Traceback" in debug.stderr
