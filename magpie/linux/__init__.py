"""The Linux floor (imports nothing else of magpie): namespaces, /proc readers, process trees, CPU time."""
