"""Lance's on-disk artifacts: manifests, transaction and deletion files, row ids, schema, naming, listing."""
