"""Writing specs and their lock files: `reconcile init`'s survey of the machine and its draft, and
`reconcile lock`'s lock file. Called by reconcile.commands.init and reconcile.commands.lock."""
