"""The Supervisor: actor tree, restart strategies, recovery, lifecycle, daemon main()."""
