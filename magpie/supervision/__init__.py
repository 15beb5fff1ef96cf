"""Process supervision: the processes magpie starts and keeps (the zygote that forks them,
the parked ones it keeps, the parent side of each, their scratch folders, the device lock
they take turns on). Nothing here decides a verdict or takes a measurement: that is the
judging in `magpie.harness`; code under test runs in `magpie.sandbox`.

It lies above the sandbox, which it puts processes in, and the Linux floor (`magpie.linux`),
and imports nothing above it: the zygote names the harness modules it preloads as strings
(`zygote_server.PRELOAD`), for the children it forks."""
