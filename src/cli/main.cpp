// kestrel's single binary: parses the subcommand and turns any error into a
// message on stderr and exit status 1 (2 for a usage error).
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"kestrel: a native inference server for Falcon models"};
  app.require_subcommand(1);
  std::string log_level = "info";
  kestrel::init_logging(log_level);
  app.add_option("--log-level", log_level, "debug, info, warn or error")
      ->capture_default_str()
      ->each([](const std::string& level) { kestrel::init_logging(level); });
  kestrel::cli::add_model_commands(app);
  kestrel::cli::add_generate_command(app);
  kestrel::cli::add_random_model_command(app);
  kestrel::cli::add_tokenize_commands(app);
#ifdef KESTREL_HAVE_SERVER
  kestrel::cli::add_serve_command(app);
  kestrel::cli::add_chat_template_command(app);
#endif
  kestrel::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
