#!/usr/bin/env python3
"""carry's command line from a checkout: the same CLI as the installed `carry` command (carry/cli/)."""

from carry.cli.main import main

if __name__ == "__main__":
    main()
