// The `kestrel` subcommands. Each file under cli/ registers its own on the app;
// main() only parses and maps errors to an exit status.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "core/tensor.h"

namespace kestrel::cli {

void add_model_commands(CLI::App& app);         // logits             (model_cmds.cpp)
void add_generate_command(CLI::App& app);       // generate           (generate_cmd.cpp)
void add_random_model_command(CLI::App& app);   // random-model       (random_model_cmd.cpp)
void add_tokenize_commands(CLI::App& app);      // tokenize, detokenize (tokenize_cmd.cpp)
void add_serve_command(CLI::App& app);          // serve (serve_cmd.cpp; with KESTREL_HAVE_SERVER)
void add_chat_template_command(CLI::App& app);  // chat-template (chat_template_cmd.cpp; likewise)
void add_bench_command(CLI::App& app);          // bench              (bench_cmd.cpp)

// --device cuda|cpu: the device, checked to exist (device_arg.cpp).
Device parse_device_arg(const std::string& name, const char* command);
// --cuda-graphs on|off: decode steps replayed as CUDA graphs (default on; no effect on the CPU).
bool parse_cuda_graphs_arg(const std::string& value, const char* command);

}  // namespace kestrel::cli
