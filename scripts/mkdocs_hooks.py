"""MkDocs hook: the repository's CHANGELOG.md is served as the site's changelog page, so it is written once."""

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    source = Path(config["config_file_path"]).parent / "CHANGELOG.md"
    files.append(File.generated(config, "changelog.md", abs_src_path=str(source)))
    return files


# The search worker (mkdocs' search plugin, lunr): every word indexed and searched (lunr's English stop words drop
# "like", "only", "may": `--like` found nothing), and a query's lunr operators (a leading "-" prohibits a term, "+"
# requires it, "~", "^", ":" and "*" are syntax) read as separators, so that a flag such as `--like` is searched as
# the word it names rather than failing to parse (the page stayed on "Searching...").
_INDEX_ALL = "this.ref('location');"
_SEARCH = "var results = index.search(query);"


def on_post_build(config):
    worker = Path(config["site_dir"]) / "search" / "worker.js"
    if not worker.exists():
        return
    text = worker.read_text(encoding="utf-8")
    if _INDEX_ALL not in text or _SEARCH not in text:
        raise RuntimeError(f"{worker}: mkdocs' search worker changed; update scripts/mkdocs_hooks.py")
    text = text.replace(_INDEX_ALL, _INDEX_ALL + "\n      this.pipeline.remove(lunr.stopWordFilter);"
                        "\n      this.searchPipeline.remove(lunr.stopWordFilter);")  # fmt: skip
    text = text.replace(_SEARCH, "var results = [];\n  try {\n"
                        "    results = index.search(query.replace(/[-+~^:*]/g, ' '));\n"
                        "  } catch (e) {\n    console.error('search: ' + e);\n  }")  # fmt: skip
    worker.write_text(text, encoding="utf-8")
