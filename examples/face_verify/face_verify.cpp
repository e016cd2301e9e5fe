// caracal_face_agent: serves the face verification handler (face_verify.hpp). Run it next to a
// server with a `face` service and a memcached destination, with the references loaded by
// caracal_face_loader (configs/face-server.yaml and configs/face-agent.yaml):
//
//   caracal_face_loader --memcached 127.0.0.1:11211
//   caracal_face_agent --config configs/face-agent.yaml
#include <caracal/agent/agent.hpp>

#include "face_verify.hpp"

int main(int argc, char** argv) {
  return caracal::agent::agent_main<caracal::examples::face::FaceVerify>(argc, argv);
}
