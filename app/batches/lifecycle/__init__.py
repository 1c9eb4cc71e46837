"""A batch's life in the database: its input read into lines (`validate`), its status moved
(`lifecycle`: validation, cancel, expiry, one line's result), the results of the lines a node
ran written (`recording`), and its output and error files written (`output`) as it ends
(`finalize`)."""
