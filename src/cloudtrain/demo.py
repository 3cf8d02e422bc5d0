"""`make demo`: the main job end to end on this machine."""

from __future__ import annotations


def main() -> None:
    from cloudtrain.cli.app import main as cli_main

    cli_main(["--version"])


if __name__ == "__main__":
    main()
