// Bindings of c10d::store: the Store base class (subclassable from Python), HashStore,
// FileStore and PrefixStore. Every call that can block releases the GIL.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "c10d/core/exception.h"
#include "c10d/python/bindings.h"
#include "c10d/python/store_convert.h"
#include "c10d/store/file_store.h"
#include "c10d/store/hash_store.h"
#include "c10d/store/prefix_store.h"

namespace py = pybind11;

namespace c10d::python {
namespace {

using store::Bytes;
using store::Millis;
using store::Store;

// Lets a Python subclass of c10d.Store be used from C++: each virtual takes the GIL and calls
// the Python method of the same name.
class PyStore : public Store {
 public:
  using Store::Store;

  void set(const std::string& key, const Bytes& value) override {
    GilGuard gil;
    require(gil);
    override_of("set")(key, to_pybytes(value));
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    GilGuard gil;
    require(gil);
    return bytes_from_python(
        override_of("compare_set")(key, to_pybytes(expected), to_pybytes(desired)));
  }
  Bytes get(const std::string& key) override {
    GilGuard gil;
    require(gil);
    return bytes_from_python(override_of("get")(key));
  }
  int64_t add(const std::string& key, int64_t delta) override {
    GilGuard gil;
    require(gil);
    return override_of("add")(key, delta).cast<int64_t>();
  }
  bool delete_key(const std::string& key) override {
    GilGuard gil;
    require(gil);
    return override_of("delete_key", "deleteKey")(key).cast<bool>();
  }
  bool check(const std::vector<std::string>& keys) override {
    GilGuard gil;
    require(gil);
    return override_of("check")(keys).cast<bool>();
  }
  int64_t num_keys() override {
    GilGuard gil;
    require(gil);
    return override_of("num_keys", "getNumKeys")().cast<int64_t>();
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    GilGuard gil;
    require(gil);
    override_of("wait")(keys, timeout);
  }
  void append(const std::string& key, const Bytes& value) override {
    GilGuard gil;
    require(gil);
    if (auto fn = optional_override("append")) {
      fn(key, to_pybytes(value));
      return;
    }
    py::gil_scoped_release release;
    Store::append(key, value);
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override {
    GilGuard gil;
    require(gil);
    if (auto fn = optional_override("multi_get")) {
      std::vector<Bytes> out;
      for (py::handle item : fn(keys)) out.push_back(bytes_from_python(item));
      return out;
    }
    py::gil_scoped_release release;
    return Store::multi_get(keys);
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    GilGuard gil;
    require(gil);
    if (auto fn = optional_override("multi_set")) {
      py::list list;
      for (const auto& v : values) list.append(to_pybytes(v));
      fn(keys, list);
      return;
    }
    py::gil_scoped_release release;
    Store::multi_set(keys, values);
  }
  bool has_extended_api() const override {
    GilGuard gil;
    require(gil);
    if (auto fn = optional_override("has_extended_api")) return fn().cast<bool>();
    return false;
  }
  std::string describe() const override {
    GilGuard gil;
    if (!gil) return "PythonStore";
    py::object self = py::cast(this);
    return "PythonStore(" + py::str(py::type::of(self).attr("__name__")).cast<std::string>() + ")";
  }

 private:
  // Backend threads (the flight recorder's, a worker's) may call in while Python exits.
  static void require(const GilGuard& gil) {
    if (!gil) {
      throw core::DistStoreError("the Python store cannot be used: the interpreter is exiting");
    }
  }
  py::function optional_override(const char* name) const {
    return py::get_override(static_cast<const Store*>(this), name);
  }
  // `name`, or torch's C++ name of the method (`alias`), which torch's adapter for Python
  // stores calls: stores written for torch define deleteKey and getNumKeys.
  py::function override_of(const char* name, const char* alias = nullptr) const {
    py::function fn = optional_override(name);
    if (!fn && alias != nullptr) fn = optional_override(alias);
    if (!fn) {
      // torch's wording first ("Not implemented."), which its users match on.
      throw core::NotSupported(
          std::string("Not implemented: the Python store subclass does not define ") + name);
    }
    return fn;
  }
};

// Exercises a store through the C++ interface only, so a Python subclass's trampoline runs
// exactly as it would under a backend: the methods every store defines (set, get, add,
// compare_set) and the extended ones, which fall back on those. Raises on any inconsistency.
void drive_store_from_cpp(const std::shared_ptr<Store>& s) {
  using store::to_bytes;
  using store::to_string;
  s->set("_cpp/a", to_bytes("1"));
  C10D_CHECK(to_string(s->get("_cpp/a")) == "1", "get after set returned a wrong value");
  C10D_CHECK_EQ(s->add("_cpp/n", 5), 5, "first add");
  C10D_CHECK_EQ(s->add("_cpp/n", 2), 7, "second add");
  C10D_CHECK(to_string(s->get("_cpp/n")) == "7", "a counter reads back wrong");
  auto now = s->compare_set("_cpp/a", to_bytes("1"), to_bytes("2"));
  C10D_CHECK(to_string(now) == "2", "compare_set did not swap");
  now = s->compare_set("_cpp/a", to_bytes("1"), to_bytes("3"));
  C10D_CHECK(to_string(now) == "2", "compare_set swapped on a wrong expected value");
  s->multi_set({"_cpp/x", "_cpp/y"}, {to_bytes("x"), to_bytes("y")});
  auto values = s->multi_get({"_cpp/x", "_cpp/y"});
  C10D_CHECK(values.size() == 2 && to_string(values[1]) == "y", "multi_get mismatch");
  s->append("_cpp/x", to_bytes("z"));
  s->append("_cpp/new", to_bytes("po"));
  s->append("_cpp/new", to_bytes("tato"));
  C10D_CHECK(to_string(s->get("_cpp/x")) == "xz", "append mismatch");
  C10D_CHECK(to_string(s->get("_cpp/new")) == "potato", "append to a new key mismatch");
}

}  // namespace

void init_store(py::module_& m) {
  py::class_<Store, PyStore, std::shared_ptr<Store>>(
      m, "Store",
      "Key-value store shared by the ranks of a job. Subclass it in Python to provide your own "
      "(implement set, get, add, compare_set, check, delete_key, num_keys and wait).")
      .def(py::init<>())
      .def(
          "set",
          [](Store& s, const std::string& key, py::handle value) {
            Bytes bytes = bytes_from_python(value);
            py::gil_scoped_release release;
            s.set(key, bytes);
          },
          py::arg("key"), py::arg("value"), "Stores value under key, replacing any old value.")
      .def(
          "compare_set",
          [](Store& s, const std::string& key, py::handle expected, py::handle desired) {
            Bytes e = bytes_from_python(expected), d = bytes_from_python(desired);
            Bytes out;
            {
              py::gil_scoped_release release;
              out = s.compare_set(key, e, d);
            }
            return to_pybytes(out);
          },
          py::arg("key"), py::arg("expected_value"), py::arg("desired_value"),
          "Replaces the value only if it equals expected_value (creates the key when it is "
          "missing and expected_value is empty); returns the value now stored.")
      .def(
          "get",
          [](Store& s, const std::string& key) {
            Bytes out;
            {
              py::gil_scoped_release release;
              out = s.get(key);
            }
            return to_pybytes(out);
          },
          py::arg("key"), "Waits up to the store timeout for key and returns its value.")
      .def("add", &Store::add, py::arg("key"), py::arg("amount"),
           py::call_guard<py::gil_scoped_release>(),
           "Adds amount to the integer counter under key (created at 0); returns the new value.")
      .def("check", &Store::check, py::arg("keys"), py::call_guard<py::gil_scoped_release>(),
           "True if every key exists (does not wait).")
      .def("delete_key", &Store::delete_key, py::arg("key"),
           py::call_guard<py::gil_scoped_release>(), "Removes key; True if it existed.")
      .def("num_keys", &Store::num_keys, py::call_guard<py::gil_scoped_release>(),
           "Number of keys in the store.")
      .def("set_timeout", &Store::set_timeout, py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>(), "Sets the default timeout of get and wait.")
      .def_property_readonly("timeout", &Store::timeout)
      .def(
          "wait", [](Store& s, const std::vector<std::string>& keys) { s.wait(keys); },
          py::arg("keys"), py::call_guard<py::gil_scoped_release>(),
          "Waits up to the store timeout until every key exists.")
      .def(
          "wait",
          [](Store& s, const std::vector<std::string>& keys, Millis timeout) {
            s.wait(keys, timeout);
          },
          py::arg("keys"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
          "Waits up to timeout until every key exists.")
      .def(
          "append",
          [](Store& s, const std::string& key, py::handle value) {
            Bytes bytes = bytes_from_python(value);
            py::gil_scoped_release release;
            s.append(key, bytes);
          },
          py::arg("key"), py::arg("value"), "Appends value to the bytes under key.")
      .def(
          "multi_get",
          [](Store& s, const std::vector<std::string>& keys) {
            std::vector<Bytes> values;
            {
              py::gil_scoped_release release;
              values = s.multi_get(keys);
            }
            py::list out;
            for (const auto& v : values) out.append(to_pybytes(v));
            return out;
          },
          py::arg("keys"), "Waits for and returns the values of every key.")
      .def(
          "multi_set",
          [](Store& s, const std::vector<std::string>& keys, py::sequence values) {
            std::vector<Bytes> bytes;
            for (py::handle v : values) bytes.push_back(bytes_from_python(v));
            py::gil_scoped_release release;
            s.multi_set(keys, bytes);
          },
          py::arg("keys"), py::arg("values"), "Stores every (key, value) pair.")
      .def("has_extended_api", &Store::has_extended_api)
      .def(
          "queue_push",
          [](Store& s, const std::string& key, py::handle value) {
            Bytes bytes = bytes_from_python(value);
            py::gil_scoped_release release;
            s.queue_push(key, bytes);
          },
          py::arg("key"), py::arg("value"), "Appends value to the queue under key.")
      .def(
          "queue_pop",
          [](Store& s, const std::string& key, bool block) {
            Bytes out;
            {
              py::gil_scoped_release release;
              out = s.queue_pop(key, block);
            }
            return to_pybytes(out);
          },
          py::arg("key"), py::arg("block") = true,
          "Removes and returns the oldest value of the queue (waiting up to the timeout when "
          "block is true, else raising DistQueueEmptyError when empty).")
      .def("queue_len", &Store::queue_len, py::arg("key"), py::call_guard<py::gil_scoped_release>())
      .def("list_keys", &Store::list_keys, py::call_guard<py::gil_scoped_release>())
      .def("clone", &Store::clone, py::call_guard<py::gil_scoped_release>(),
           "An independent handle on the same data (a new connection for network stores).")
      .def("__repr__", [](const Store& s) { return "<c10d." + s.describe() + ">"; });

  py::class_<store::HashStore, Store, std::shared_ptr<store::HashStore>>(
      m, "HashStore", "Store held in this process's memory, shared by its threads.")
      .def(py::init<>());

  py::class_<store::FileStore, Store, std::shared_ptr<store::FileStore>>(
      m, "FileStore",
      "Store kept in a file that processes on one machine (or a shared file system) open "
      "together. The last of world_size users to close it removes the file.")
      .def(py::init([](const std::string& file_name, int world_size) {
             py::gil_scoped_release release;  // not call_guard (bindings.h)
             return std::make_shared<store::FileStore>(file_name, world_size);
           }),
           py::arg("file_name"), py::arg("world_size") = -1)
      .def_property_readonly("path", &store::FileStore::path);

  py::class_<store::PrefixStore, Store, std::shared_ptr<store::PrefixStore>>(
      m, "PrefixStore", "A view of another store where every key is prefixed by 'prefix/'.")
      // Keeps the wrapped store's Python object alive: a Python subclass's methods live there.
      .def(py::init<std::string, std::shared_ptr<Store>>(), py::arg("prefix"), py::arg("store"),
           py::keep_alive<1, 3>())
      .def_property_readonly("underlying_store", &store::PrefixStore::underlying_store)
      .def_property_readonly("_underlying_non_prefix_store",
                             &store::PrefixStore::underlying_non_prefix_store)
      .def_property_readonly("prefix", &store::PrefixStore::prefix);

  m.def("_test_python_store", &drive_store_from_cpp, py::arg("store"),
        py::call_guard<py::gil_scoped_release>(),
        "Runs a fixed sequence of operations on a store through its C++ interface.");
}

}  // namespace c10d::python
