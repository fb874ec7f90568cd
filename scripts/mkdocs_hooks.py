"""MkDocs hook: the repository's CHANGELOG.md is served as the site's changelog page, so it is written once."""

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    source = Path(config["config_file_path"]).parent / "CHANGELOG.md"
    files.append(File.generated(config, "changelog.md", abs_src_path=str(source)))
    return files
