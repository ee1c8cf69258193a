"""Plans for the Table verbs: pylance writes the data, each plan returns one transaction.

One module per family: :mod:`.writing` (append, overwrite, fragments written
elsewhere), :mod:`.rows` (delete, update), :mod:`.merging` (merge_insert),
:mod:`.columns` (add, drop, alter), :mod:`.maintenance` (compact, create_index,
restore, config and metadata). Plans are synchronous (pylance's data plane is); the
async Table runs them in a worker thread.
"""
