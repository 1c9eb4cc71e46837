"""The claims and their order: which pending lines each node takes next (`claims`), the
leases on the lines it holds (`leases`), the lanes that take none for now (`pauses`), the
lines waiting for each lane (`health`), and when each running batch will finish, the same
order played forward (`projection`)."""
