// Placeholder until the tokenizer lands: `tokenize` / `detokenize` are registered there.
#include "cli/commands.h"

namespace kestrel::cli {
void add_tokenize_commands(CLI::App&) {}
}  // namespace kestrel::cli
