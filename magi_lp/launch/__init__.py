"""Local Launchpad processes: the Launchpad seam, supervision and exit reports, network
isolation, process markers, Ctrl-C before a launch and during a save, files written whole,
the status monitor (Linux and Launchpad; no ML framework).

`docs/architecture.md` lists each module; docs/development.md's Layout shows this paragraph.
"""
