"""Model folders: read without leaving them, written whole or not at all.

:mod:`~prunereg._folders.output` builds an output folder beside its target and
renames it into place once complete (:class:`~prunereg._folders.output.AtomicFolder`);
:mod:`~prunereg._folders.model_dir` reads an input folder the way transformers
does, refusing links that lead out of it.
"""
