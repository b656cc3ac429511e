"""Where prunereg touches the disk: outputs written whole or not at all, model folders read without leaving them."""
