"""The batch domain: the service (`service`), the runner's loop (`runner`), the claims and
their order (`claims/`), a batch's life from validation to its output files (`lifecycle/`),
the nodes on one database (`nodes`), a batch's throughput (`throughput`), and the
dashboard's "Run with" (`run_with`)."""
