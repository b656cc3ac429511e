"""Where prunereg touches the disk: outputs appear whole or not at all, input folders are read without leaving them.

- :mod:`.folder`: :class:`~prunereg._disk.folder.AtomicFolder`, an output folder built
  beside its target and renamed into place once complete (every folder-writing command);
- :mod:`.files`: :class:`~prunereg._disk.files.AtomicOutputs`, output files written under
  temporary names and put in place together, never over a file that appeared meanwhile;
- :mod:`.model_dir`: an input folder read the way transformers reads it, refusing links out of it
  and anything in it but regular files of the sizes their kinds have;
- :mod:`.input_file`: the one opener of files prunereg did not write (regular files only, opened
  without blocking, bounded); :mod:`.safetensors_file`: a weight file's header read bounded, and
  safetensors handed the file the opener checked;
- :mod:`.signals`: SIGTERM and SIGHUP end a command through its clean-up, as Ctrl-C does, and
  wait while a folder is made or deleted;
- :mod:`.rename`: the one-step swap of two folders; :mod:`.paths`: temporary names, umask,
  where a path lies; :mod:`.errors`: ``CheckpointError``, the error of model files, and how paths
  and sizes read in it.
"""
