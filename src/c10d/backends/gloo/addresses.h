// The Gloo backend's address handling: where a rank listens, how ranks name each other's TCP
// addresses, and which peers' hosts answer (for timeout messages). Private to the backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "c10d/store/store.h"

namespace c10d::backends::gloo::detail {

// "; unreachable: ranks 2, 3 on host 10.0.0.2 ..." for the timeout message, or "" when every
// peer's host answered.
std::string silent_peers_note(const std::vector<std::vector<std::string>>& addresses);

// The host other ranks rendezvous at, when `store` is (or wraps) a TCPStore, else "".
std::string store_host(const std::shared_ptr<store::Store>& store);

// The non-empty pieces of `text` between separators.
std::vector<std::string> split(const std::string& text, char separator);

// `text` if it is an address as Gloo's TCP transport prints it ("[127.0.0.1]:41235"), without
// the "$<sequence>" some Gloo versions append; otherwise "".
std::string tcp_address_text(std::string text);

// The addresses `rank` advertised at Gloo's rendezvous, by peer, decoded from its record:
// connectFullMesh stores under the rank's number the address of its pair with every other
// rank, in rank order, all of one size. "" where the record does not hold TCP addresses.
std::vector<std::string> advertised_addresses(const store::Bytes& record, int rank, int size);

}  // namespace c10d::backends::gloo::detail
