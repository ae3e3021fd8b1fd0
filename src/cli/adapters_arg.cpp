#include "cli/adapters_arg.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kestrel::cli {

std::vector<std::shared_ptr<const LoraAdapter>> load_adapters(const FalconModel& model,
                                                              const std::string& path,
                                                              size_t n_prompts) {
  std::ifstream in(path);
  KESTREL_CHECK(in.good(), "--adapters: cannot open ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    KESTREL_FAIL("--adapters: ", path, " is not valid JSON: ", e.what());
  }
  KESTREL_CHECK(j.is_array() && j.size() == n_prompts, "--adapters: ", path,
                " must be a JSON list with one entry per prompt (", n_prompts, "), not ",
                j.dump().substr(0, 200));
  std::map<std::string, std::shared_ptr<const LoraAdapter>> by_dir;
  std::vector<std::shared_ptr<const LoraAdapter>> out;
  for (const nlohmann::json& e : j) {
    if (e.is_null()) {
      out.push_back(nullptr);
      continue;
    }
    KESTREL_CHECK(e.is_string(), "--adapters: ", path, ": entry ", e.dump(),
                  " is neither a folder path nor null");
    const std::string dir = e.get<std::string>();
    auto& ad = by_dir[dir];
    if (!ad) ad = model.load_adapter(dir, dir);
    out.push_back(ad);
  }
  return out;
}

}  // namespace kestrel::cli
