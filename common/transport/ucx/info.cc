#include "common/transport/ucx/info.h"

#include <dirent.h>
#include <sys/stat.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/config/knob.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

const char* DeviceType(uct_device_type_t type) {
  switch (type) {
    case UCT_DEVICE_TYPE_NET: return "net";
    case UCT_DEVICE_TYPE_SHM: return "shm";
    case UCT_DEVICE_TYPE_ACC: return "acc";
    case UCT_DEVICE_TYPE_SELF: return "self";
    default: return "other";
  }
}

// The entries of `dir` other than "." and "..", sorted; errno of opendir in `*error`.
std::vector<std::string> List(const std::string& dir, int* error) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    *error = errno;
    return names;
  }
  *error = 0;
  while (const dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The resources of one memory domain of `component`.
void AddMdResources(uct_component_h component, const std::string& component_name,
                    const std::string& md_name, std::vector<UcxResource>* out) {
  uct_md_config_t* config = nullptr;
  if (uct_md_config_read(component, nullptr, nullptr, &config) != UCS_OK) return;
  uct_md_h md = nullptr;
  const ucs_status_t opened = uct_md_open(component, md_name.c_str(), config, &md);
  uct_config_release(config);
  if (opened != UCS_OK) return;
  uct_tl_resource_desc_t* resources = nullptr;
  unsigned count = 0;
  if (uct_md_query_tl_resources(md, &resources, &count) == UCS_OK) {
    for (unsigned i = 0; i < count; ++i) {
      out->push_back({component_name, md_name, resources[i].tl_name, resources[i].dev_name,
                      DeviceType(resources[i].dev_type)});
    }
    uct_release_tl_resource_list(resources);
  }
  uct_md_close(md);
}

}  // namespace

std::vector<RdmaPort> ReadRdmaPorts(const std::string& sysfs_infiniband, std::string* why_none) {
  std::vector<RdmaPort> ports;
  int error = 0;
  const std::vector<std::string> devices = List(sysfs_infiniband, &error);
  if (error == ENOENT) {
    *why_none = fmt::format("no RDMA device: {} is absent", sysfs_infiniband);
    return ports;
  }
  if (error != 0) {
    *why_none = fmt::format("no RDMA device: {} is unreadable ({})", sysfs_infiniband,
                            std::strerror(error));
    return ports;
  }
  if (devices.empty()) {
    *why_none = fmt::format("no RDMA device: {} is empty", sysfs_infiniband);
    return ports;
  }
  for (const std::string& dev : devices) {
    const std::string ports_dir = fmt::format("{}/{}/ports", sysfs_infiniband, dev);
    for (const std::string& port : List(ports_dir, &error)) {
      const std::string base = fmt::format("{}/{}", ports_dir, port);
      ports.push_back({dev, port, FirstLine(base + "/link_layer"), FirstLine(base + "/state")});
    }
  }
  if (ports.empty()) {
    *why_none = fmt::format("no RDMA device: {} lists devices without ports", sysfs_infiniband);
  } else {
    why_none->clear();
  }
  return ports;
}

StatusOr<UcxInventory> QueryUcxInventory(const std::string& sysfs_infiniband) {
  UcxInventory inv;
  inv.version = ucp_get_version_string();
  uct_component_h* components = nullptr;
  unsigned count = 0;
  const ucs_status_t s = uct_query_components(&components, &count);
  if (s != UCS_OK) {
    return UnavailableError(fmt::format("uct_query_components: {}", ucs_status_string(s)));
  }
  for (unsigned i = 0; i < count; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME | UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[i], &attr) != UCS_OK) continue;
    const std::string name = attr.name;
    inv.components.push_back(name);
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (mds.empty() || uct_component_query(components[i], &attr) != UCS_OK) {
      inv.components_without_md.push_back(name);
      continue;
    }
    for (const uct_md_resource_desc_t& md : mds) {
      AddMdResources(components[i], name, md.md_name, &inv.resources);
    }
  }
  uct_release_component_list(components);
  inv.rdma_ports = ReadRdmaPorts(sysfs_infiniband, &inv.rdma_absent_reason);
  return inv;
}

std::string LoopbackNetDevices(const std::string& sysfs_infiniband) {
  std::string why_none;
  std::string devices = "lo";
  for (const RdmaPort& p : ReadRdmaPorts(sysfs_infiniband, &why_none)) {
    devices += "," + p.device + ":" + p.port;
  }
  return devices;
}

std::vector<UcxResource> ParseContextResources(std::string_view context_info) {
  std::vector<UcxResource> out;
  std::istringstream in{std::string(context_info)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(" resource ") == std::string::npos) continue;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    const std::string resource = line.substr(line.rfind(' ') + 1);  // "... flags -- tcp/lo"
    const size_t slash = resource.find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == resource.size()) continue;
    UcxResource r;
    r.transport = resource.substr(0, slash);
    r.device = resource.substr(slash + 1);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<UcxLane> ParseEpLanes(std::string_view ep_info) {
  std::vector<UcxLane> lanes;
  std::istringstream in{std::string(ep_info)};
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("lane[");
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(at));
    std::string lane_word, resource;
    words >> lane_word >> resource;  // "lane[0]:", "1:tcp/lo.0"
    UcxLane lane;
    const size_t close = lane_word.find(']');
    uint64_t index = 0;
    if (close == std::string::npos || close < 5 ||
        !config::ParseUint(std::string_view(lane_word).substr(5, close - 5), &index) ||
        index > 255) {
      continue;
    }
    lane.index = static_cast<int>(index);
    const size_t colon = resource.find(':');
    const size_t slash = resource.find('/');
    if (colon == std::string::npos || slash == std::string::npos || slash < colon) continue;
    lane.transport = resource.substr(colon + 1, slash - colon - 1);
    lane.device = resource.substr(slash + 1);
    const size_t dot = lane.device.rfind('.');  // ".0": the path index
    if (dot != std::string::npos) lane.device.resize(dot);
    // The operations follow the remote side ("-> md[0]/tcp/sysdev[255]") or, without one, the
    // memory domain ("md[0]").
    std::vector<std::string> rest;
    for (std::string w; words >> w;) rest.push_back(w);
    auto from = std::find(rest.begin(), rest.end(), "->");
    if (from != rest.end()) {
      from += std::min<std::ptrdiff_t>(2, rest.end() - from);
    } else {
      from = std::find_if(rest.begin(), rest.end(),
                          [](const std::string& w) { return w.rfind("md[", 0) != 0; });
    }
    for (auto it = from; it != rest.end(); ++it) {
      if (!lane.ops.empty()) lane.ops += ' ';
      lane.ops += *it;
    }
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

std::string LaneTransports(const std::vector<UcxLane>& lanes) {
  std::vector<std::string> seen;
  std::string out;
  for (const UcxLane& l : lanes) {
    const std::string tl = l.transport + "/" + l.device;
    if (std::find(seen.begin(), seen.end(), tl) != seen.end()) continue;
    seen.push_back(tl);
    if (!out.empty()) out += ',';
    out += tl;
  }
  return out;
}

}  // namespace bitpush::transport::ucx_backend
