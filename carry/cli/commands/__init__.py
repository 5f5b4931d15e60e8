"""One module per command (or small family of commands); carry/cli/main.py loads each when it runs."""
