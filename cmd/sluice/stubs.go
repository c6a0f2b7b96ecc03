package main

// Subcommands whose issues have not landed yet. Each moves to its own file
// when it is built.
