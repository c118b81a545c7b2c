"""What keeps root safe with files: names from outside checked before any join, quoting writers for
generated files, path ownership and no-follow opens, secrets kept out of records. docs/security.md.
"""
