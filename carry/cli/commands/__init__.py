"""One module per command (or small family of commands); carry/cli/__init__.py loads each when it runs."""
