"""Where prunereg touches the disk: outputs appear whole or not at all, input folders are read without leaving them.

- :mod:`.folder`: :class:`~prunereg._disk.folder.AtomicFolder`, an output folder built
  beside its target and renamed into place once complete (every folder-writing command);
- :mod:`.files`: :class:`~prunereg._disk.files.AtomicOutputs`, output files written under
  temporary names and put in place together, never over a file that appeared meanwhile;
- :mod:`.model_dir`: an input folder read the way transformers reads it, refusing links out of it;
- :mod:`.signals`: SIGTERM and SIGHUP end a command through its clean-up, as Ctrl-C does;
- :mod:`.rename`: the one-step swap of two folders; :mod:`.paths`: temporary names, umask,
  where a path lies; :mod:`.errors`: ``CheckpointError``, the error of model files.
"""
